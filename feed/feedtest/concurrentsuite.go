package feedtest

import (
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// The subtests of the concurrent write mode alone, run under "Concurrent/".
// They write through the store's own harness (e.raw), whose writes stay
// unsealed until e.sealAll, where the other subtests seal each write at once.

// writeUnsealed commits changes to f without sealing them.
func (e *env) writeUnsealed(f feed.FeedName, changes ...feed.Change) feed.WriteResult {
	e.t.Helper()
	res, err := e.raw.Write(e.ctx, f, changes)
	if err != nil {
		e.t.Fatalf("Write(%s, %d changes), unsealed: %v", f, len(changes), err)
	}
	if res.First != 0 || res.Last != 0 || len(res.Unsealed) != len(changes) {
		e.t.Fatalf("an unsealed write's result = %+v, want no seqs and %d keys", res, len(changes))
	}
	return res
}

// sealAll runs rounds on f until one seals nothing and returns how many rows
// they sealed.
func (e *env) sealAll(f feed.FeedName) int {
	e.t.Helper()
	total := 0
	for {
		n, err := e.raw.Seal(e.ctx, f)
		if err != nil {
			e.t.Fatalf("Seal(%s): %v", f, err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}

func (e *env) sealedRange(keys ...feed.Key) (feed.Generation, feed.Seq, feed.Seq, bool) {
	e.t.Helper()
	g, first, last, sealed, err := e.raw.Store.(sealRanger).SealedRange(e.ctx, e.feed, keys)
	if err != nil {
		e.t.Fatalf("SealedRange(%v): %v", keys, err)
	}
	return g, first, last, sealed
}

// feedUnsealedBesideSealed: a concurrent-mode write is invisible to readers
// until sealed, its key's sealed value stays readable at its seq meanwhile,
// and a round seals it above the head, with the latest committed value.
func feedUnsealedBesideSealed(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`1`)))
	e.writeUnsealed(e.feed, feed.Put("a", doc(`2`)))
	e.writeUnsealed(e.feed, feed.Put("a", doc(`3`)))
	e.writeUnsealed(e.feed, feed.Delete("b"), feed.Put("c", doc(`1`)))
	if g, _, _, sealed := e.sealedRange("a", "c"); sealed || g != 1 {
		t.Errorf("SealedRange of unsealed keys = generation %d sealed %v; want generation 1, unsealed", g, sealed)
	}
	if g, first, last, sealed := e.sealedRange("zz"); !sealed || first != 0 || last != 0 || g != 1 {
		t.Errorf("SealedRange of a key never written = %d %d..%d %v; want generation 1, sealed, no seqs", g, first, last, sealed)
	}
	b := e.readAll(e.feed, 0)
	if diff := sameRecords(b.Records, []feed.Record{rec("a", 1, `1`), rec("b", 2, `1`)}); diff != "" || b.Head != 2 {
		t.Errorf("ReadBatch with unsealed writes (sealed rows only, head 2): head %d, %s", b.Head, diff)
	}
	if n := e.sealAll(e.feed); n != 3 {
		t.Errorf("rounds sealed %d rows, want 3 (a, b, c; a's two writes are one row)", n)
	}
	b = e.readAll(e.feed, 0)
	if diff := sameRecords(b.Records, []feed.Record{rec("a", 3, `3`), rec("b", 4, ""), rec("c", 5, `1`)}); diff != "" || b.Head != 5 {
		t.Errorf("ReadBatch after sealing (the latest value of each key, above the old head): head %d, %s", b.Head, diff)
	}
	if g, first, last, sealed := e.sealedRange("a", "c"); !sealed || first != 3 || last != 5 || g != 1 {
		t.Errorf("SealedRange(a, c) after sealing = %d %d..%d %v; want generation 1, 3..5, sealed", g, first, last, sealed)
	}
}

// feedRebuildDropsUnsealed: a rebuild empties the feed of the old
// generation's unsealed writes too, so none is sealed into the new one.
func feedRebuildDropsUnsealed(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)))
	e.writeUnsealed(e.feed, feed.Put("a", doc(`2`)), feed.Put("b", doc(`2`)))
	if g := e.rebuild(); g != 2 {
		t.Fatalf("Rebuild = generation %d, want 2", g)
	}
	e.writeUnsealed(e.feed, feed.Put("c", doc(`3`)))
	e.sealAll(e.feed)
	b := e.readAll(e.feed, 0)
	if diff := sameRecords(b.Records, []feed.Record{rec("c", 2, `3`)}); diff != "" || b.Generation != 2 {
		t.Errorf("ReadBatch after a rebuild over unsealed writes (the new generation's only): generation %d, %s", b.Generation, diff)
	}
}

// feedSetModeLockedSeals: moving a feed back to the locked mode seals what
// is unsealed first, and its next write gets seqs at once; a bad mode is
// refused, naming the field.
func feedSetModeLockedSeals(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)))
	e.writeUnsealed(e.feed, feed.Put("b", doc(`2`)))
	wantInvalid(t, "SetMode(bogus)", e.raw.SetMode(e.ctx, e.feed, "bogus"), "mode")
	if err := e.raw.SetMode(e.ctx, e.feed, feed.WriteLocked); err != nil {
		t.Fatalf("SetMode(locked): %v", err)
	}
	if diff := sameRecords(e.readAll(e.feed, 0).Records, []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`)}); diff != "" {
		t.Errorf("ReadBatch after moving to the locked mode (the unsealed write sealed): %s", diff)
	}
	res, err := e.raw.Write(e.ctx, e.feed, []feed.Change{feed.Put("c", doc(`3`))})
	if err != nil || res.First != 3 || res.Last != 3 || res.Unsealed != nil {
		t.Errorf("a write in the locked mode again = %+v, %v; want seq 3 and no unsealed keys", res, err)
	}
}

// syncCollectKeepsUnsealedPut: collection leaves a tombstone whose key has an
// unsealed put, since the put lives beside it and would go with it.
func syncCollectKeepsUnsealedPut(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`1`)))
	e.write(e.feed, feed.Delete("a"), feed.Delete("b"))
	id := e.sink("s")
	l := e.acquire(id)
	e.cas(feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 4}})
	e.writeUnsealed(e.feed, feed.Put("a", doc(`2`)))
	e.collect("a tombstone with an unsealed put beside it, and one without", 1)
	e.sealAll(e.feed)
	e.wantRows("after sealing the put", rec("a", 5, `2`))
}

// syncDescribeUnsealed: Describe reports the mode and the unsealed backlog,
// and a sink's Pending counts sealed rows only.
func syncDescribeUnsealed(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)))
	id := e.sink("s")
	e.acquire(id)
	e.writeUnsealed(e.feed, feed.Put("a", doc(`2`)), feed.Put("b", doc(`2`)))
	d := e.describe(e.feed)
	if d.Mode != feed.WriteConcurrent || d.Unsealed != 2 || d.Head != 1 || len(d.Sinks) != 1 || d.Sinks[0].Pending != 1 {
		t.Errorf("Describe with two unsealed keys = mode %q unsealed %d head %d sinks %+v; want concurrent, 2, head 1, one sink pending 1", d.Mode, d.Unsealed, d.Head, d.Sinks)
	}
	e.sealAll(e.feed)
	d = e.describe(e.feed)
	if d.Unsealed != 0 || d.Head != 3 || len(d.Sinks) != 1 || d.Sinks[0].Pending != 2 {
		t.Errorf("Describe after sealing = unsealed %d head %d sinks %+v; want 0, head 3, one sink pending 2", d.Unsealed, d.Head, d.Sinks)
	}
}
