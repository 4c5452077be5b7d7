package read

import (
	"context"
	"sync"
)

// NoTx is the transaction of a store that has none: the in-memory store passes
// it to Commit's apply.
type NoTx struct{}

// MemoryStore is an ephemeral ProjectionStore. It serialises commits: apply
// runs while the store's lock is held and after the checkpoint guard passed,
// so a commit whose guard loses never runs apply at all, and a reset waits
// for a commit running apply. An apply that fails leaves the checkpoint where
// it was; what apply already did to an in-memory view is the caller's to
// undo, since there is no transaction to roll back.
type MemoryStore struct {
	mu          sync.Mutex
	checkpoints map[CheckpointKey]Checkpoint
}

var _ ProjectionStore[NoTx] = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{checkpoints: make(map[CheckpointKey]Checkpoint)}
}

// Durability is Ephemeral.
func (*MemoryStore) Durability() Durability { return Ephemeral }

// ReadCheckpoint returns key's checkpoint.
func (s *MemoryStore) ReadCheckpoint(_ context.Context, key CheckpointKey) (Checkpoint, error) {
	if err := key.Validate(); err != nil {
		return Checkpoint{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpoints[key], nil
}

// Commit runs apply and moves the checkpoint; see ProjectionStore.
func (s *MemoryStore) Commit(ctx context.Context, key CheckpointKey, expected Checkpoint, next Position, apply func(context.Context, NoTx) error) error {
	if err := ValidateCommit(key, expected, next); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if at := s.checkpoints[key]; at != expected {
		return &CheckpointSupersededError{Key: key, Expected: expected, Actual: at}
	}
	if apply != nil {
		if err := apply(ctx, NoTx{}); err != nil {
			return err
		}
	}
	s.checkpoints[key] = Checkpoint{Position: next, Epoch: expected.Epoch}
	return nil
}

// ResetCheckpoint moves key back to Origin in its next epoch.
func (s *MemoryStore) ResetCheckpoint(_ context.Context, key CheckpointKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkpoints[key] = Checkpoint{Position: Origin, Epoch: s.checkpoints[key].Epoch + 1}
	return nil
}
