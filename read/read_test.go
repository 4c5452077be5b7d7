package read_test

import (
	"context"
	"errors"
	"testing"

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
	applied := 0
	apply := func(context.Context, read.NoTx) error { applied++; return nil }
	if err := s.Commit(ctx, key, read.Origin, 5, apply); err != nil {
		t.Fatal(err)
	}
	// A second runner that read Origin loses, and its apply never runs.
	err := s.Commit(ctx, key, read.Origin, 3, apply)
	var sup *read.CheckpointSupersededError
	if !errors.Is(err, read.ErrCheckpointSuperseded) || !errors.As(err, &sup) || sup.Actual != 5 {
		t.Fatalf("err = %v, want superseded at 5", err)
	}
	if applied != 1 {
		t.Fatalf("apply ran %d times, want 1", applied)
	}
	// A failing apply leaves the checkpoint where it was.
	boom := errors.New("view write failed")
	if err := s.Commit(ctx, key, 5, 9, func(context.Context, read.NoTx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want apply's error", err)
	}
	if at, _ := s.ReadCheckpoint(ctx, key); at != 5 {
		t.Fatalf("checkpoint %d after a failed apply, want 5", at)
	}
	// Reset goes back to Origin, for this key only.
	other := read.CheckpointKey{Projection: "orders", Partition: "us"}
	if err := s.Commit(ctx, other, read.Origin, 2, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ResetCheckpoint(ctx, key); err != nil {
		t.Fatal(err)
	}
	if at, _ := s.ReadCheckpoint(ctx, key); at != read.Origin {
		t.Fatalf("checkpoint %d after reset, want Origin", at)
	}
	if at, _ := s.ReadCheckpoint(ctx, other); at != 2 {
		t.Fatalf("other key moved by the reset: %d", at)
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
		{"empty projection", s.Commit(ctx, read.CheckpointKey{}, 0, 1, nil), "checkpoint.projection"},
		{"bad partition", s.Commit(ctx, read.CheckpointKey{Projection: "p", Partition: "a b"}, 0, 1, nil), "checkpoint.partition"},
		{"next not above expected", s.Commit(ctx, read.CheckpointKey{Projection: "p"}, 4, 4, nil), "commit.next"},
		{"negative expected", s.Commit(ctx, read.CheckpointKey{Projection: "p"}, -1, 4, nil), "commit.expected"},
		{"reset bad key", s.ResetCheckpoint(ctx, read.CheckpointKey{Projection: "p\x00"}), "checkpoint.projection"},
	} {
		var inv *feed.InvalidError
		if !errors.As(tc.err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: err = %v, want an InvalidError naming %s", tc.name, tc.err, tc.field)
		}
	}
}
