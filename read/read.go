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
//
// # Why a checkpoint has an epoch
//
// A position alone cannot tell the origin before a reset from the origin
// after it, and a commit from the origin is exactly what the first replay
// batch after a rebuild makes. Should a second reset come while that commit
// waits (for a lock the reset holds), the commit would find the checkpoint at
// the origin it expected and land after the reset: the output of the
// projection the second rebuild was run to throw away would stay in the view,
// and with WithFeed in the feed and every sink, with the new replay
// continuing after it. So a Checkpoint is a position and an epoch, the number
// of resets the checkpoint went through; every reset moves the epoch on, the
// compare-and-set compares both, and a commit that read the checkpoint before
// a reset loses whatever position it read, the origin included.
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

// Checkpoint is where a projection's checkpoint stands: what ReadCheckpoint
// returns and Commit expects. Position is how far the projection got; Epoch
// is how many times the checkpoint was reset (0 until its first reset), so
// that a commit that read the checkpoint before a reset loses after it, even
// from the origin (see the package doc). The zero value is a checkpoint that
// never moved.
type Checkpoint struct {
	Position Position
	Epoch    int64
}

func (c Checkpoint) String() string {
	return fmt.Sprintf("position %d (epoch %d)", c.Position, c.Epoch)
}

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
	// ReadCheckpoint returns key's checkpoint; the zero Checkpoint when it
	// never moved.
	ReadCheckpoint(ctx context.Context, key CheckpointKey) (Checkpoint, error)
	// Commit runs apply and moves key's checkpoint from expected (as
	// ReadCheckpoint returned it) to position next, in expected's epoch, as
	// one unit: when the checkpoint is not at expected, position and epoch,
	// or apply fails, nothing of it lands (a durable store rolls the
	// transaction back) and Commit returns a *CheckpointSupersededError or
	// apply's error. next must be above expected's position.
	Commit(ctx context.Context, key CheckpointKey, expected Checkpoint, next Position, apply func(ctx context.Context, tx Tx) error) error
	// ResetCheckpoint moves key's checkpoint back to Origin in its next
	// epoch, so the projection replays from the start and every commit that
	// read the checkpoint before the reset loses. Emptying the view first is
	// the caller's job.
	ResetCheckpoint(ctx context.Context, key CheckpointKey) error
}

// ErrCheckpointSuperseded: a Commit found the checkpoint elsewhere than it
// expected (another runner moved it, or a reset did). Nothing it carried landed.
var ErrCheckpointSuperseded = fmt.Errorf("checkpoint superseded")

// CheckpointSupersededError says which checkpoint moved under a Commit, and
// where it was found. It matches ErrCheckpointSuperseded.
type CheckpointSupersededError struct {
	Key      CheckpointKey
	Expected Checkpoint
	Actual   Checkpoint
}

func (e *CheckpointSupersededError) Error() string {
	return fmt.Sprintf("checkpoint %s: %v: expected %v, found %v", e.Key, ErrCheckpointSuperseded, e.Expected, e.Actual)
}

// Is reports whether target is ErrCheckpointSuperseded.
func (e *CheckpointSupersededError) Is(target error) bool { return target == ErrCheckpointSuperseded }

// ValidateCommit checks a Commit's arguments; stores call it first.
func ValidateCommit(key CheckpointKey, expected Checkpoint, next Position) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if expected.Position < Origin {
		return feed.Invalid("commit.expected.position", "is %d; positions are never negative", expected.Position)
	}
	if expected.Epoch < 0 {
		return feed.Invalid("commit.expected.epoch", "is %d; epochs are never negative", expected.Epoch)
	}
	if next <= expected.Position {
		return feed.Invalid("commit.next", "is %d; it must be above the expected position (%d)", next, expected.Position)
	}
	return nil
}
