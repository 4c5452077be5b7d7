package memfeed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/syncer"
)

// memfeed implements what syncer.Runner and syncer.WaitApplied need of a
// store with concurrent-mode feeds.
var (
	_ syncer.Sealer     = (*memfeed.Store)(nil)
	_ syncer.SealWaiter = (*memfeed.Store)(nil)
)

func concurrentStore(t *testing.T, f feed.FeedName) *memfeed.Store {
	t.Helper()
	s := newStore(t)
	if err := s.SetWriteMode(t.Context(), f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	return s
}

func readAll(t *testing.T, s *memfeed.Store, f feed.FeedName) []feed.Record {
	t.Helper()
	b, err := s.ReadBatch(t.Context(), f, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		t.Fatal(err)
	}
	return b.Records
}

// A round skips a key an open writer holds, even one with a committed
// unsealed value, and a later round seals it with that writer's value once
// it commits; writers of other keys do not wait for it.
func TestRoundSkipsKeyOfOpenWriter(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := concurrentStore(t, "f")
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	open := s.Begin()
	defer open.Rollback()
	res, err := s.Write(ctx, open, "f", []feed.Change{feed.Put("a", doc(`2`))})
	if err != nil || len(res.Unsealed) != 1 || res.First != 0 {
		t.Fatalf("Write in the concurrent mode = %+v, %v; want a's key unsealed, no seqs", res, err)
	}
	// Another writer of another key does not wait for the open one.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.WriteCommitted(wctx, "f", []feed.Change{feed.Put("b", doc(`1`))}); err != nil {
		t.Fatalf("a writer of another key: %v", err)
	}
	if n, err := s.SealRound(ctx, "f"); err != nil || n != 1 {
		t.Fatalf("SealRound with a held = %d, %v; want 1 (b only)", n, err)
	}
	if got := readAll(t, s, "f"); len(got) != 1 || got[0].Key != "b" || got[0].Seq != 1 {
		t.Fatalf("after a round that skipped a: %v; want b@1 only", got)
	}
	// A second writer of a waits for the open one.
	sctx, scancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer scancel()
	second := s.Begin()
	if _, err := s.Write(sctx, second, "f", []feed.Change{feed.Put("a", doc(`3`))}); err == nil {
		t.Fatal("a second writer of a held key did not wait")
	}
	second.Rollback()
	if err := open.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.SealRound(ctx, "f"); err != nil || n != 1 {
		t.Fatalf("SealRound after the commit = %d, %v; want 1", n, err)
	}
	got := readAll(t, s, "f")
	if len(got) != 2 || got[1].Key != "a" || got[1].Seq != 2 || string(got[1].Doc) != `2` {
		t.Fatalf("after the writer's commit and a round: %v; want b@1, a@2 = 2", got)
	}
}

// A reset and a mode change wait for every open writer; the mode change to
// locked seals what is unsealed first.
func TestResetAndModeChangeWaitForWriters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := concurrentStore(t, "f")
	open := s.Begin()
	defer open.Rollback()
	if _, err := s.Write(ctx, open, "f", []feed.Change{feed.Put("a", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := s.SetWriteMode(short, "f", feed.WriteLocked); err == nil {
		t.Fatal("SetWriteMode did not wait for an open writer")
	}
	reset := s.Begin()
	if _, err := reset.ResetFeed(short, "f"); err == nil {
		t.Fatal("ResetFeed did not wait for an open writer")
	}
	reset.Rollback()
	if err := open.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetWriteMode(ctx, "f", feed.WriteLocked); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, "f"); len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("after moving to the locked mode: %v; want a@1 sealed", got)
	}
	d, err := s.Describe(ctx, "f")
	if err != nil || d.Mode != feed.WriteLocked || d.Unsealed != 0 {
		t.Fatalf("Describe = %+v, %v; want the locked mode, nothing unsealed", d, err)
	}
	var inv *feed.InvalidError
	if err := s.SetWriteMode(ctx, "f", "fast"); !errors.As(err, &inv) || inv.Field != "mode" {
		t.Fatalf("SetWriteMode(fast) = %v; want an InvalidError naming mode", err)
	}
}

// RunSealer seals what writers commit, shows its lease in Describe while it
// runs, and clears it when its context ends; WaitApplied waits for the seal.
func TestRunSealerSeals(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := concurrentStore(t, "f")
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.RunSealer(sctx, "f") }()
	res, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a", doc(`1`)), feed.Put("b", doc(`1`))})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, first, last, sealed, err := s.SealedRange(ctx, "f", res.Unsealed)
		if err != nil {
			t.Fatal(err)
		}
		if sealed {
			if g != 1 || first != 1 || last != 2 {
				t.Fatalf("SealedRange = %d %d..%d; want generation 1, 1..2", g, first, last)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("RunSealer sealed nothing in 10s")
		}
		time.Sleep(time.Millisecond)
	}
	if d, err := s.Describe(ctx, "f"); err != nil || d.Sealer == nil || d.Mode != feed.WriteConcurrent {
		t.Fatalf("Describe while the sealer runs = %+v, %v; want its lease and the concurrent mode", d, err)
	}
	stop()
	<-done
	if d, err := s.Describe(ctx, "f"); err != nil || d.Sealer != nil {
		t.Fatalf("Describe after the sealer stopped = %+v, %v; want no sealer lease", d, err)
	}
}

// A running sealer of a feed in the locked mode seals the first write after
// a switch to the concurrent mode at once: the switch's end wakes it, as
// pgfeed's notification wakes pgfeed's, with its heartbeat an hour away.
func TestSealerWakesOnModeSwitch(t *testing.T) {
	t.Parallel()
	s, err := memfeed.New(memfeed.Options{Lease: feed.LeaseOptions{TTL: 5 * time.Hour, Heartbeat: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("locked", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RunSealer(ctx, "f") }()
	time.Sleep(50 * time.Millisecond) // the sealer found the feed locked
	if err := s.SetWriteMode(ctx, "f", feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	res, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("after", doc(`2`))})
	if err != nil || len(res.Unsealed) != 1 {
		t.Fatalf("write after the switch = %+v, %v; want it unsealed", res, err)
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		_, _, _, sealed, err := s.SealedRange(ctx, "f", res.Unsealed)
		if err != nil {
			t.Fatal(err)
		}
		if sealed {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("the write after the switch is unsealed 5 s later")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
