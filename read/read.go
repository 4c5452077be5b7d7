// Package read is as much of an event-sourcing read side as a feed needs: a
// checkpoint per (projection, partition), a ProjectionStore that commits a
// projection's writes together with its checkpoint, an in-memory store, and a
// Runner that replays an EventSource into a store in batches. Package pgread
// has the Postgres store, the event log, and WithFeed, the decorator that ties
// a feed's generation to a checkpoint reset.
//
// # Why a checkpoint compare-and-set
//
// A projection applies events in order and records how far it got. Two
// runners of one projection (a deploy overlap, a stuck process) must not both
// apply the same events: Commit lands only when the checkpoint is where the
// caller read it, and a commit that loses changes nothing, so exactly one
// runner's writes survive for each range of events. The same guard is what
// makes a rebuild safe: a reset moves the checkpoint back to Origin, so a commit
// still in flight with the old checkpoint loses and rolls back its writes (and,
// with WithFeed, its feed rows).
package read

import (
	"context"
	"fmt"

	"github.com/kairos-es/kairos/feed"
)

// CheckpointKey names one checkpoint: a projection, and a partition of it (""
// when the projection is not partitioned). Both follow feed's name rule, except
// that the partition may be empty.
type CheckpointKey struct {
	Projection string
	Partition  string
}

func (k CheckpointKey) String() string {
	if k.Partition == "" {
		return k.Projection
	}
	return k.Projection + "/" + k.Partition
}

// Validate checks the key before anything is read or written.
func (k CheckpointKey) Validate() error {
	if _, err := feed.ParseFeedName(k.Projection); err != nil {
		return renameField(err, "checkpoint.projection")
	}
	if k.Partition != "" {
		if _, err := feed.ParseFeedName(k.Partition); err != nil {
			return renameField(err, "checkpoint.partition")
		}
	}
	return nil
}

func renameField(err error, field string) error {
	if inv, ok := err.(*feed.InvalidError); ok {
		return &feed.InvalidError{Field: field, Reason: inv.Reason, Err: inv.Err}
	}
	return err
}

// Position is how far a projection got: the global position of the last event
// it applied. Origin means nothing applied yet.
type Position int64

// Origin is the position before the first event.
const Origin Position = 0

// Durability says whether a store's checkpoints (and the views written with
// them) survive a restart.
type Durability int

const (
	// Ephemeral stores keep everything in memory; a restart replays from
	// Origin. They open no transaction a feed could join.
	Ephemeral Durability = iota + 1
	// Durable stores commit to a database, in a transaction the projection's
	// view writes and a feed's rows join.
	Durable
)

func (d Durability) String() string {
	switch d {
	case Ephemeral:
		return "ephemeral"
	case Durable:
		return "durable"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

// ProjectionStore keeps checkpoints and commits a projection's writes with
// them. Tx is the transaction the writes join: pgx.Tx for the Postgres store,
// NoTx for the in-memory one.
type ProjectionStore[Tx any] interface {
	// Durability says whether commits survive a restart.
	Durability() Durability
	// ReadCheckpoint returns key's position; Origin when it has none.
	ReadCheckpoint(ctx context.Context, key CheckpointKey) (Position, error)
	// Commit runs apply and moves key's checkpoint from expected to next, as one
	// unit: when the checkpoint is not at expected, or apply fails, nothing of
	// it lands (a durable store rolls the transaction back) and Commit returns a
	// *CheckpointSupersededError or apply's error. next must be above expected.
	Commit(ctx context.Context, key CheckpointKey, expected, next Position, apply func(ctx context.Context, tx Tx) error) error
	// ResetCheckpoint moves key's checkpoint back to Origin, so the projection
	// replays from the start. Emptying the view first is the caller's job.
	ResetCheckpoint(ctx context.Context, key CheckpointKey) error
}

// ErrCheckpointSuperseded: a Commit found the checkpoint elsewhere than it
// expected (another runner moved it, or a reset did). Nothing it carried landed.
var ErrCheckpointSuperseded = fmt.Errorf("checkpoint superseded")

// CheckpointSupersededError says which checkpoint moved under a Commit. It
// matches ErrCheckpointSuperseded.
type CheckpointSupersededError struct {
	Key      CheckpointKey
	Expected Position
	Actual   Position
}

func (e *CheckpointSupersededError) Error() string {
	return fmt.Sprintf("checkpoint %s: %v: expected position %d, found %d", e.Key, ErrCheckpointSuperseded, e.Expected, e.Actual)
}

// Is reports whether target is ErrCheckpointSuperseded.
func (e *CheckpointSupersededError) Is(target error) bool { return target == ErrCheckpointSuperseded }

// ValidateCommit checks a Commit's arguments; stores call it first.
func ValidateCommit(key CheckpointKey, expected, next Position) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if expected < Origin {
		return feed.Invalid("commit.expected", "is %d; positions are never negative", expected)
	}
	if next <= expected {
		return feed.Invalid("commit.next", "is %d; it must be above expected (%d)", next, expected)
	}
	return nil
}
