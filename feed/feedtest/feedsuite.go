package feedtest

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// RunFeed runs the writer and reader conformance suite: the store built by
// newStore must pass every subtest. Subtests run in parallel, each with a store
// from newStore and feed names of its own. The package doc lists what each
// subtest proves.
func RunFeed(t *testing.T, newStore NewStore) {
	t.Helper()
	runModes(t, func(t *testing.T, mode feed.WriteMode) {
		run := func(name string, f func(t *testing.T, e *env)) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f(t, newEnv(t, newStore, mode))
			})
		}
		run("NeverWritten", feedNeverWritten)
		run("RoundTrip", feedRoundTrip)
		run("Compaction", feedCompaction)
		run("ConcurrentWritersCommitOrder", feedConcurrentWriters)
		run("ReadBatchWindow", feedReadBatchWindow)
		run("ReadBatchBytes", feedReadBatchBytes)
		run("Rebuild", feedRebuild)
		run("Subscribe", feedSubscribe)
		run("FeedsIndependent", feedsIndependent)
		run("BadInput", feedBadInput)
		if mode == feed.WriteConcurrent {
			run("UnsealedBesideSealed", feedUnsealedBesideSealed)
			run("RebuildDropsUnsealed", feedRebuildDropsUnsealed)
			run("SetModeLockedSeals", feedSetModeLockedSeals)
		}
	})
}

func feedNeverWritten(t *testing.T, e *env) {
	if h := e.head(e.feed); h != 0 {
		t.Errorf("Head of a never-written feed = %d, want 0", h)
	}
	g, err := e.h.Reader.Generation(e.ctx, e.feed)
	if err != nil || g != feed.FirstGeneration {
		t.Errorf("Generation of a never-written feed = %d, %v; want %d", g, err, feed.FirstGeneration)
	}
	b := e.readAll(e.feed, 0)
	if b.Generation != feed.FirstGeneration || b.Head != 0 || len(b.Records) != 0 {
		t.Errorf("ReadBatch of a never-written feed = generation %d head %d %s; want generation 1, head 0, no records", b.Generation, b.Head, describeRecords(b.Records))
	}
}

func feedRoundTrip(t *testing.T, e *env) {
	res := e.write(e.feed,
		feed.Put("a", doc(`{"n": 1, "s": "x"}`)),
		feed.Put("b/ü ñ", doc(`[1, 2.5, "three", {"four": null}]`)),
		feed.Put("c", doc(`"just a string"`)),
	)
	if want := (feed.WriteResult{Generation: 1, First: 1, Last: 3}); !reflect.DeepEqual(res, want) {
		t.Errorf("first write's result = %+v, want %+v", res, want)
	}
	b := e.readAll(e.feed, 0)
	if diff := sameRecords(b.Records, []feed.Record{
		rec("a", 1, `{"s":"x","n":1}`),
		rec("b/ü ñ", 2, `[1,2.5,"three",{"four":null}]`),
		rec("c", 3, `"just a string"`),
	}); diff != "" {
		t.Errorf("ReadBatch after one write: %s", diff)
	}
	if b.Generation != 1 || b.Head != 3 {
		t.Errorf("ReadBatch generation %d head %d, want 1 and 3", b.Generation, b.Head)
	}
	if h := e.head(e.feed); h != 3 {
		t.Errorf("Head = %d, want 3", h)
	}
	res = e.write(e.feed)
	if res.First != 0 || res.Last != 0 {
		t.Errorf("an empty write's result = %+v, want First = Last = 0", res)
	}
	if h := e.head(e.feed); h != 3 {
		t.Errorf("Head after an empty write = %d, want 3", h)
	}
}

func feedCompaction(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`{"v":1}`)), feed.Put("b", doc(`{"v":1}`)))
	res := e.write(e.feed, feed.Put("a", doc(`{"v":2}`)))
	if res.First != 3 || res.Last != 3 {
		t.Errorf("update's result = %+v, want seq 3", res)
	}
	e.write(e.feed, feed.Delete("b"))
	// Within one batch the last change of a key wins, and takes one seq.
	res = e.write(e.feed, feed.Put("c", doc(`{"v":1}`)), feed.Put("d", doc(`{"v":1}`)), feed.Put("c", doc(`{"v":2}`)), feed.Delete("d"), feed.Put("c", doc(`{"v":3}`)))
	if res.First != 5 || res.Last != 6 {
		t.Errorf("compacted batch's result = %+v, want seqs 5..6 (two keys)", res)
	}
	b := e.readAll(e.feed, 0)
	want := []feed.Record{
		rec("a", 3, `{"v":2}`),
		rec("b", 4, ""),
		rec("d", 5, ""),
		rec("c", 6, `{"v":3}`),
	}
	if e.concurrent {
		// A sealing round hands out seqs in key order, not in the order
		// of the write's changes.
		want[2], want[3] = rec("c", 5, `{"v":3}`), rec("d", 6, "")
	}
	if diff := sameRecords(b.Records, want); diff != "" {
		t.Errorf("ReadBatch after updates and deletes (one row per key, tombstones with a nil Doc): %s", diff)
	}
	if b.Head != 6 {
		t.Errorf("Head = %d, want 6", b.Head)
	}
}

// feedConcurrentWriters checks guarantee 2: writers commit concurrently while a
// reader tails the feed. Every key is written once, so no row ever moves, and a
// reader that tails by seq must see every seq exactly once; a row committed
// with a seq below one the reader already passed would be missed.
func feedConcurrentWriters(t *testing.T, e *env) {
	const writers, writes, perWrite = 8, 20, 3
	sub, err := e.h.Reader.Subscribe(e.ctx, e.feed)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Close()

	type landed struct {
		keys []feed.Key
		res  feed.WriteResult
	}
	results := make(chan landed, writers*writes)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range writes {
				var changes []feed.Change
				var keys []feed.Key
				for j := range perWrite {
					k := feed.Key(fmt.Sprintf("w%d-%d-%d", w, i, j))
					keys = append(keys, k)
					changes = append(changes, feed.Put(k, doc(fmt.Sprintf(`{"w":%d,"i":%d,"j":%d}`, w, i, j))))
				}
				res, err := e.h.Write(e.ctx, e.feed, changes)
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				results <- landed{keys, res}
			}
		})
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	const total = writers * writes * perWrite
	seen := make(map[feed.Key]feed.Seq)
	var last feed.Seq
	deadline := time.Now().Add(4 * waitLimit)
	for done := false; ; {
		b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, last, feed.BatchLimit{Records: 7})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if r.Seq <= last {
				t.Fatalf("ReadBatch after %d handed out seq %d", last, r.Seq)
			}
			if prev, dup := seen[r.Key]; dup {
				t.Fatalf("key %s seen at seq %d and again at %d; it was written once", r.Key, prev, r.Seq)
			}
			seen[r.Key], last = r.Seq, r.Seq
		}
		if len(b.Records) > 0 {
			continue
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tail saw %d of %d rows before the deadline", len(seen), total)
		}
		select {
		case <-writersDone:
			done = true // one more read after the last commit, then stop
		case <-sub.C():
		case <-time.After(5 * time.Millisecond): // wake-ups may be lost; poll too
		}
	}
	close(results)
	if t.Failed() {
		return
	}
	if h := e.head(e.feed); h != total {
		t.Errorf("Head = %d, want %d", h, total)
	}
	if len(seen) != total {
		t.Fatalf("the tail saw %d rows, the writers committed %d: a row committed below a seq the tail had passed", len(seen), total)
	}
	taken := make(map[feed.Seq]bool, total)
	for l := range results {
		if l.res.Last-l.res.First+1 != perWrite {
			t.Errorf("write result %+v is not a contiguous range of %d seqs", l.res, perWrite)
			continue
		}
		for j, k := range l.keys {
			want := l.res.First + feed.Seq(j)
			if taken[want] {
				t.Errorf("seq %d handed to two writes", want)
			}
			taken[want] = true
			if seen[k] != want {
				t.Errorf("key %s read at seq %d, its write said %d", k, seen[k], want)
			}
		}
	}
	for s := feed.Seq(1); s <= total; s++ {
		if !taken[s] {
			t.Errorf("seq %d was handed to no write: seqs are not contiguous", s)
		}
	}
}

func feedReadBatchWindow(t *testing.T, e *env) {
	for i := range 10 {
		e.write(e.feed, feed.Put(feed.Key(fmt.Sprintf("k%02d", i)), doc(fmt.Sprintf(`{"i":%d}`, i))))
	}
	for _, c := range []struct {
		after      feed.Seq
		limit      int
		first, end feed.Seq // seqs first..end, none when end < first
		more       bool
	}{
		{0, 3, 1, 3, true},
		{3, 3, 4, 6, true},
		{9, 5, 10, 10, false},
		{10, 5, 1, 0, false},
		{100, 5, 1, 0, false},
		{0, 1, 1, 1, true},
		{5, 5, 6, 10, false}, // full, and nothing follows
		{5, feed.MaxBatchLimit, 6, 10, false},
	} {
		b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, c.after, feed.BatchLimit{Records: c.limit})
		if err != nil {
			t.Errorf("ReadBatch(after %d, limit %d): %v", c.after, c.limit, err)
			continue
		}
		var want []feed.Record
		for s := c.first; s <= c.end; s++ {
			want = append(want, rec(fmt.Sprintf("k%02d", s-1), s, fmt.Sprintf(`{"i":%d}`, s-1)))
		}
		if diff := sameRecords(b.Records, want); diff != "" {
			t.Errorf("ReadBatch(after %d, limit %d): %s", c.after, c.limit, diff)
		}
		if b.Generation != 1 || b.Head != 10 {
			t.Errorf("ReadBatch(after %d, limit %d): generation %d head %d, want 1 and 10", c.after, c.limit, b.Generation, b.Head)
		}
		if b.More != c.more {
			t.Errorf("ReadBatch(after %d, limit %d): More = %v, want %v", c.after, c.limit, b.More, c.more)
		}
	}
}

// feedReadBatchBytes holds ReadBatch to its byte bound: a record that would
// take the batch past limit.Bytes ends it and sets More, a first record
// larger than the bound is handed out alone, tombstones count their key, and
// reading on from each batch's last seq gets every record exactly once.
func feedReadBatchBytes(t *testing.T, e *env) {
	// Records of 10 bytes: a 2-byte key and an 8-byte document; k3 is a
	// 2-byte tombstone and k5 a 42-byte record.
	for i := range 8 {
		k := feed.Key(fmt.Sprintf("k%d", i))
		switch i {
		case 3:
			e.write(e.feed, feed.Put(k, doc(`"placeh"`)))
			e.write(e.feed, feed.Delete(k))
		case 5:
			e.write(e.feed, feed.Put(k, doc(`"`+strings.Repeat("x", 38)+`"`)))
		default:
			e.write(e.feed, feed.Put(k, doc(fmt.Sprintf(`"doc-%02d"`, i))))
		}
	}
	// Seqs now: k0 1, k1 2, k2 3, k3 5 (its tombstone), k4 6, k5 7, k6 8, k7 9.
	for _, c := range []struct {
		after   feed.Seq
		records int
		bytes   int
		seqs    []feed.Seq
		more    bool
	}{
		{0, 100, 30, []feed.Seq{1, 2, 3}, true},                // exactly 30 fits
		{0, 100, 29, []feed.Seq{1, 2}, true},                   // the third would pass 29
		{3, 100, 12, []feed.Seq{5, 6}, true},                   // the tombstone counts 2
		{6, 100, 10, []feed.Seq{7}, true},                      // 42 bytes alone: a batch is never empty
		{7, 100, 10, []feed.Seq{8}, true},                      // exactly 10 fits
		{8, 100, 10, []feed.Seq{9}, false},                     // cut by nothing: the end
		{0, 2, 1000, []feed.Seq{1, 2}, true},                   // the record limit first
		{0, 100, 0, []feed.Seq{1, 2, 3, 5, 6, 7, 8, 9}, false}, // 0: no byte bound
		{9, 100, 10, nil, false},
	} {
		b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, c.after, feed.BatchLimit{Records: c.records, Bytes: c.bytes})
		if err != nil {
			t.Errorf("ReadBatch(after %d, %d records, %d bytes): %v", c.after, c.records, c.bytes, err)
			continue
		}
		var seqs []feed.Seq
		for _, r := range b.Records {
			seqs = append(seqs, r.Seq)
		}
		if fmt.Sprint(seqs) != fmt.Sprint(c.seqs) || b.More != c.more {
			t.Errorf("ReadBatch(after %d, %d records, %d bytes) = seqs %v More %v, want %v More %v", c.after, c.records, c.bytes, seqs, b.More, c.seqs, c.more)
		}
	}
	// Reading on: every record once, in order, no batch over the bound
	// unless it holds one record.
	var got []feed.Seq
	for after, reads := feed.Seq(0), 0; ; reads++ {
		if reads > 20 {
			t.Fatalf("reading on by bytes did not reach the end: %v", got)
		}
		b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, after, feed.BatchLimit{Records: 100, Bytes: 25})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		size := 0
		for _, r := range b.Records {
			got = append(got, r.Seq)
			size += r.Size()
			after = r.Seq
		}
		if size > 25 && len(b.Records) > 1 {
			t.Errorf("a batch of %d records holds %d bytes, over its bound of 25", len(b.Records), size)
		}
		if !b.More {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]feed.Seq{1, 2, 3, 5, 6, 7, 8, 9}) {
		t.Errorf("reading on by bytes got seqs %v, want each of 1 2 3 5 6 7 8 9 once", got)
	}
}

func feedRebuild(t *testing.T, e *env) {
	if e.h.Rebuild == nil {
		t.Fatal("the harness has no Rebuild")
	}
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`)), feed.Put("c", doc(`3`)))
	e.write(e.feed, feed.Delete("b"))
	g, err := e.h.Rebuild(e.ctx, e.feed)
	if err != nil || g != 2 {
		t.Fatalf("Rebuild = %d, %v; want generation 2", g, err)
	}
	if g, err := e.h.Reader.Generation(e.ctx, e.feed); err != nil || g != 2 {
		t.Errorf("Generation after a rebuild = %d, %v; want 2", g, err)
	}
	b := e.readAll(e.feed, 0)
	if len(b.Records) != 0 || b.Generation != 2 || b.Head != 4 {
		t.Errorf("ReadBatch after a rebuild: generation %d head %d %s; want generation 2, head 4 (seqs are not reset), no rows", b.Generation, b.Head, describeRecords(b.Records))
	}
	res := e.write(e.feed, feed.Put("a", doc(`10`)))
	if want := (feed.WriteResult{Generation: 2, First: 5, Last: 5}); !reflect.DeepEqual(res, want) {
		t.Errorf("first write after a rebuild = %+v, want %+v (above the old head)", res, want)
	}
	b = e.readAll(e.feed, 0)
	if diff := sameRecords(b.Records, []feed.Record{rec("a", 5, `10`)}); diff != "" || b.Generation != 2 {
		t.Errorf("ReadBatch of the new generation: generation %d, %s", b.Generation, diff)
	}
	if g, err := e.h.Rebuild(e.ctx, e.feed); err != nil || g != 3 {
		t.Errorf("second Rebuild = %d, %v; want 3", g, err)
	}
	if b := e.readAll(e.feed, 0); b.Generation != 3 || len(b.Records) != 0 || b.Head != 5 {
		t.Errorf("ReadBatch after a second rebuild: generation %d head %d %s; want 3, 5, none", b.Generation, b.Head, describeRecords(b.Records))
	}
}

func feedSubscribe(t *testing.T, e *env) {
	sub, err := e.h.Reader.Subscribe(e.ctx, e.feed)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Close()
	for i := range 3 {
		e.write(e.feed, feed.Put("k", doc(fmt.Sprintf(`%d`, i))))
		select {
		case <-sub.C():
		case <-time.After(waitLimit):
			t.Fatalf("commit %d: no wake-up within %v", i+1, waitLimit)
		}
	}
	sub.Close()
	sub.Close() // safe more than once
}

func feedsIndependent(t *testing.T, e *env) {
	other := uniqueFeed(t)
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`)))
	if res := e.write(other, feed.Put("a", doc(`"other"`))); res.First != 1 || res.Generation != 1 {
		t.Errorf("first write of a second feed = %+v, want generation 1 seq 1 (seqs are per feed)", res)
	}
	if _, err := e.h.Rebuild(e.ctx, e.feed); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	b := e.readAll(other, 0)
	if diff := sameRecords(b.Records, []feed.Record{rec("a", 1, `"other"`)}); diff != "" || b.Generation != 1 || b.Head != 1 {
		t.Errorf("the other feed after a write and a rebuild of the first: generation %d head %d, %s", b.Generation, b.Head, diff)
	}
	if h := e.head(e.feed); h != 2 {
		t.Errorf("Head of the first feed = %d, want 2", h)
	}
}

// badNames are feed or sink names every store must refuse.
var badNames = map[string]string{
	"empty":         "",
	"over-long":     strings.Repeat("n", feed.MaxNameLen+1),
	"space":         "bad name",
	"leading dash":  "-x",
	"invalid UTF-8": "n\xff",
	"NUL":           "n\x00",
}

func feedBadInput(t *testing.T, e *env) {
	good := feed.Put("good", doc(`{"ok":true}`))
	for name, bad := range map[string]feed.Change{
		"empty key":         feed.Put("", doc(`1`)),
		"over-long key":     feed.Put(feed.Key(strings.Repeat("k", feed.MaxKeyLen+1)), doc(`1`)),
		"NUL in key":        feed.Put("a\x00b", doc(`1`)),
		"invalid UTF-8 key": feed.Put("a\xffb", doc(`1`)),
		"empty delete key":  feed.Delete(""),
	} {
		_, err := e.h.Write(e.ctx, e.feed, []feed.Change{good, bad})
		wantInvalid(t, "Write with an "+name, err, "changes[1].key")
	}
	for name, bad := range map[string]string{
		"invalid JSON":        `{"a":`,
		"empty document":      ``,
		"JSON null":           `null`,
		"NUL escape":          `{"a":"x\u0000y"}`,
		"two values":          `1 2`,
		"NUL escape in a key": `{"\u0000":1}`,
		"lone surrogate":      `{"a":"\ud800"}`,
		"invalid UTF-8":       "{\"a\":\"\xff\"}",
		"number out of range": `{"a":1e131072}`,
	} {
		_, err := e.h.Write(e.ctx, e.feed, []feed.Change{good, {Key: "bad", Doc: []byte(bad)}})
		wantInvalid(t, "Write with "+name, err, "changes[1].doc")
	}
	_, err := e.h.Write(e.ctx, e.feed, []feed.Change{good, feed.Put("bad", nil)})
	wantInvalid(t, "Write with a nil document (a deletion is feed.Delete's)", err, "changes[1].doc")
	if b := e.readAll(e.feed, 0); len(b.Records) != 0 || b.Head != 0 {
		t.Errorf("after refused batches the feed holds %s at head %d; a batch with one bad change must write nothing", describeRecords(b.Records), b.Head)
	}
	for name, bad := range badNames {
		f := feed.FeedName(bad)
		_, err := e.h.Write(e.ctx, f, []feed.Change{good})
		wantInvalid(t, "Write to a feed name "+name, err, "feed name")
		_, err = e.h.Reader.Head(e.ctx, f)
		wantInvalid(t, "Head of a feed name "+name, err, "feed name")
		_, err = e.h.Reader.Generation(e.ctx, f)
		wantInvalid(t, "Generation of a feed name "+name, err, "feed name")
		_, err = e.h.Reader.ReadBatch(e.ctx, f, 0, feed.BatchLimit{Records: 10})
		wantInvalid(t, "ReadBatch of a feed name "+name, err, "feed name")
		sub, err := e.h.Reader.Subscribe(e.ctx, f)
		wantInvalid(t, "Subscribe to a feed name "+name, err, "feed name")
		if sub != nil {
			sub.Close()
		}
		if e.h.Rebuild != nil {
			_, err = e.h.Rebuild(e.ctx, f)
			wantInvalid(t, "Rebuild of a feed name "+name, err, "feed name")
		}
	}
	for _, limit := range []int{0, -1, feed.MaxBatchLimit + 1} {
		_, err := e.h.Reader.ReadBatch(e.ctx, e.feed, 0, feed.BatchLimit{Records: limit})
		wantInvalid(t, fmt.Sprintf("ReadBatch with limit %d", limit), err, "limit.records")
	}
	_, err = e.h.Reader.ReadBatch(e.ctx, e.feed, 0, feed.BatchLimit{Records: 10, Bytes: -1})
	wantInvalid(t, "ReadBatch with a negative byte bound", err, "limit.bytes")
	_, err = e.h.Reader.ReadBatch(e.ctx, e.feed, -1, feed.BatchLimit{Records: 10})
	wantInvalid(t, "ReadBatch after -1", err, "after")
}
