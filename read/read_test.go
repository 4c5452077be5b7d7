package read_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/read"
)

func TestMemoryStoreCommitGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := read.NewMemoryStore()
	key := read.CheckpointKey{Projection: "orders", Partition: "eu"}
	if s.Durability() != read.Ephemeral {
		t.Fatal("the memory store must say it is ephemeral")
	}
	if at, err := s.ReadCheckpoint(ctx, key); err != nil || at != (read.Checkpoint{}) {
		t.Fatalf("fresh checkpoint = %v, %v; want the zero checkpoint", at, err)
	}
	applied := 0
	apply := func(context.Context, read.NoTx) error { applied++; return nil }
	if err := s.Commit(ctx, key, read.Checkpoint{}, 5, apply); err != nil {
		t.Fatal(err)
	}
	// A second runner that read the origin loses, and its apply never runs.
	err := s.Commit(ctx, key, read.Checkpoint{}, 3, apply)
	var sup *read.CheckpointSupersededError
	if !errors.Is(err, read.ErrCheckpointSuperseded) || !errors.As(err, &sup) || sup.Actual != (read.Checkpoint{Position: 5}) {
		t.Fatalf("err = %v, want superseded at 5", err)
	}
	if applied != 1 {
		t.Fatalf("apply ran %d times, want 1", applied)
	}
	// A failing apply leaves the checkpoint where it was.
	boom := errors.New("view write failed")
	if err := s.Commit(ctx, key, read.Checkpoint{Position: 5}, 9, func(context.Context, read.NoTx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want apply's error", err)
	}
	if at, _ := s.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: 5}) {
		t.Fatalf("checkpoint %v after a failed apply, want position 5", at)
	}
	// Reset goes back to the origin of the next epoch, for this key only.
	other := read.CheckpointKey{Projection: "orders", Partition: "us"}
	if err := s.Commit(ctx, other, read.Checkpoint{}, 2, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ResetCheckpoint(ctx, key); err != nil {
		t.Fatal(err)
	}
	if at, _ := s.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: read.Origin, Epoch: 1}) {
		t.Fatalf("checkpoint %v after reset, want the origin of epoch 1", at)
	}
	if at, _ := s.ReadCheckpoint(ctx, other); at != (read.Checkpoint{Position: 2}) {
		t.Fatalf("other key moved by the reset: %v", at)
	}
	// Commits in the new epoch move the position and keep the epoch.
	if err := s.Commit(ctx, key, read.Checkpoint{Epoch: 1}, 4, nil); err != nil {
		t.Fatal(err)
	}
	if at, _ := s.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: 4, Epoch: 1}) {
		t.Fatalf("checkpoint %v, want position 4 of epoch 1", at)
	}
}

// A commit that read the checkpoint before a reset loses after it, whatever
// position it read: the origin too, which is where the first replay batch
// after an earlier reset commits from.
func TestMemoryStoreCommitAcrossReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := read.CheckpointKey{Projection: "orders"}
	for _, tc := range []struct {
		name  string
		setup func(s *read.MemoryStore) error
	}{
		{"origin never reset", func(*read.MemoryStore) error { return nil }},
		{"origin after a reset", func(s *read.MemoryStore) error {
			if err := s.Commit(ctx, key, read.Checkpoint{}, 5, nil); err != nil {
				return err
			}
			return s.ResetCheckpoint(ctx, key)
		}},
		{"position", func(s *read.MemoryStore) error { return s.Commit(ctx, key, read.Checkpoint{}, 5, nil) }},
	} {
		s := read.NewMemoryStore()
		if err := tc.setup(s); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		read1, err := s.ReadCheckpoint(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ResetCheckpoint(ctx, key); err != nil {
			t.Fatal(err)
		}
		applied := false
		err = s.Commit(ctx, key, read1, read1.Position+1, func(context.Context, read.NoTx) error { applied = true; return nil })
		var sup *read.CheckpointSupersededError
		if !errors.As(err, &sup) || sup.Expected != read1 || sup.Actual != (read.Checkpoint{Epoch: read1.Epoch + 1}) || applied {
			t.Fatalf("%s: commit from %v across a reset: err = %v, applied %v; want superseded at the origin of epoch %d, apply not run", tc.name, read1, err, applied, read1.Epoch+1)
		}
		if at, _ := s.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Epoch: read1.Epoch + 1}) {
			t.Fatalf("%s: checkpoint %v after the lost commit", tc.name, at)
		}
	}
}

// Two commits from one checkpoint, the second made while the first's apply
// runs: the second waits for the first, then loses without running its
// apply. A store that checked the guard and ran apply without holding its
// lock across both would let both land.
func TestMemoryStoreSerialisesCommits(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	s := read.NewMemoryStore()
	key := read.CheckpointKey{Projection: "orders"}
	inApply, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- s.Commit(ctx, key, read.Checkpoint{}, 5, func(context.Context, read.NoTx) error {
			close(inApply)
			<-release
			return nil
		})
	}()
	recv(t, inApply, "the first commit's apply")
	secondApplied, secondDone := make(chan struct{}), make(chan error, 1)
	go func() {
		secondDone <- s.Commit(ctx, key, read.Checkpoint{}, 3, func(context.Context, read.NoTx) error {
			close(secondApplied)
			return nil
		})
	}()
	// The second commit must not get as far as its apply while the first
	// holds the store. Nothing can show it waiting, so it gets a moment to
	// run ahead, which only a broken store uses.
	select {
	case <-secondApplied:
		close(release)
		t.Fatal("a second commit from the same checkpoint ran its apply while the first's ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := recv(t, firstDone, "the first commit"); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	var sup *read.CheckpointSupersededError
	if err := recv(t, secondDone, "the second commit"); !errors.As(err, &sup) || sup.Actual != (read.Checkpoint{Position: 5}) {
		t.Fatalf("second commit: err = %v, want superseded at position 5", err)
	}
}

func TestBadInputRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := read.NewMemoryStore()
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"empty projection", s.Commit(ctx, read.CheckpointKey{}, read.Checkpoint{}, 1, nil), "checkpoint.projection"},
		{"bad partition", s.Commit(ctx, read.CheckpointKey{Projection: "p", Partition: "a b"}, read.Checkpoint{}, 1, nil), "checkpoint.partition"},
		{"next not above expected", s.Commit(ctx, read.CheckpointKey{Projection: "p"}, read.Checkpoint{Position: 4}, 4, nil), "commit.next"},
		{"negative expected", s.Commit(ctx, read.CheckpointKey{Projection: "p"}, read.Checkpoint{Position: -1}, 4, nil), "commit.expected.position"},
		{"negative epoch", s.Commit(ctx, read.CheckpointKey{Projection: "p"}, read.Checkpoint{Epoch: -1}, 4, nil), "commit.expected.epoch"},
		{"reset bad key", s.ResetCheckpoint(ctx, read.CheckpointKey{Projection: "p\x00"}), "checkpoint.projection"},
	} {
		var inv *feed.InvalidError
		if !errors.As(tc.err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: err = %v, want an InvalidError naming %s", tc.name, tc.err, tc.field)
		}
	}
}

// recv receives from ch within 10 s, or fails the test saying what it
// waited for.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s: nothing within 10s", what)
		panic("unreachable")
	}
}
