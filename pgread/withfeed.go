package pgread

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/read"
)

// TxStore is what WithFeed needs of a store beyond read.ProjectionStore: a
// transaction on the store's own connection pool, and a checkpoint reset that
// joins it, so the reset is one transaction with the feed's half. *Store is
// one.
type TxStore interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	ResetCheckpointTx(ctx context.Context, tx pgx.Tx, key read.CheckpointKey) error
}

// ErrFeedBound: a feed is bound to another checkpoint than the one WithFeed
// was asked to bind it to.
var ErrFeedBound = errors.New("feed bound to another checkpoint")

// FeedBoundError says which checkpoint a feed is bound to. It matches
// ErrFeedBound.
type FeedBoundError struct {
	Feed   feed.FeedName
	Bound  read.CheckpointKey
	Wanted read.CheckpointKey
}

func (e *FeedBoundError) Error() string {
	return fmt.Sprintf("feed %q: %v: bound to checkpoint %q, refused for %q (one feed serves one materialisation)", e.Feed, ErrFeedBound, e.Bound.String(), e.Wanted.String())
}

// Is reports whether target is ErrFeedBound.
func (e *FeedBoundError) Is(target error) bool { return target == ErrFeedBound }

// FeedStore is a projection store whose checkpoint reset for one key also
// moves a feed to its next generation and empties it, in one transaction.
// WithFeed builds it; its doc says why and how.
type FeedStore struct {
	store read.ProjectionStore[pgx.Tx]
	tx    TxStore
	feeds *pgfeed.Store
	feed  feed.FeedName
	key   read.CheckpointKey
}

var _ read.ProjectionStore[pgx.Tx] = (*FeedStore)(nil)

// WithFeed returns store decorated so that resetting the checkpoint key also
// resets f, the feed that key's projection writes; every other key passes
// through untouched.
//
// # Why
//
// Nothing in this module rebuilds a read model: a rebuild is an application
// resetting a checkpoint and letting its runner replay. The feed has to know
// when that happens. A sink holding the copy built before the reset must be
// rebuilt from the replay, not patched by it, or a record the replay never
// writes again would stay in the sink for good. The reset is the one moment
// both the checkpoint and the feed can move together, so the generation bump
// rides on it, and every sink's worker then resyncs into a fresh copy and
// publishes it.
//
// # What stays the caller's job
//
// The decorator does the feed's half of a rebuild only. Emptying a durable
// view before the replay is the caller's job, as with the plain store's
// ResetCheckpoint; Rebuild takes a function that does it in the reset's own
// transaction. Skip it and a row the replay never writes again stays in the
// view, and a projection that reads its view back while applying (a running
// total) builds on the old rows, which the feed then carries to every sink.
//
// # One transaction, locks in one order
//
// The reset runs in one transaction opened on store's own pool (TxStore):
// first the feed lock (the feed's generations row) with the generation bump
// and the deletion of the feed's rows, then the checkpoint reset through
// store, then the caller's clear function, if any. Taking the feed lock first
// makes a commit in flight finish before the reset goes on, and a commit that
// starts after it wait; such a commit then finds the checkpoint back at the
// origin of a new epoch, loses its guard whatever position it read (the
// origin of the epoch before included: see read.Checkpoint), and rolls back
// its feed rows with its view writes. Commit through this store takes the
// feed lock before running apply, so both take the feed lock before anything
// else, and cannot deadlock, whatever apply or the clear function touch. A plain *Store's Commit takes the checkpoint row only after
// apply, so commits made through it do not deadlock with ResetCheckpoint
// either; they may with a Rebuild whose clear function touches rows their
// apply locked before writing the feed.
//
// # The binding
//
// A feed serves one materialisation: a single writer is what keeps its seqs
// in commit order and what a rebuild resets. WithFeed records key on f's
// generations row the first time, and every later WithFeed, in this process or
// any other, is refused with a *FeedBoundError when key differs.
//
// # Refusals
//
// store must be read.Durable (the feed's rows are written in the store's commit
// transaction, and an ephemeral store opens none), and must implement TxStore
// (or the reset could not be one transaction); otherwise, and for any other
// bad argument, WithFeed returns an *feed.InvalidError naming it before
// anything is written. A database failure while binding is a
// *feed.WriteFailedError.
func WithFeed(ctx context.Context, store read.ProjectionStore[pgx.Tx], feeds *pgfeed.Store, f feed.FeedName, key read.CheckpointKey) (*FeedStore, error) {
	const p = "with_feed."
	if store == nil {
		return nil, feed.Invalid(p+"store", "must not be nil")
	}
	if feeds == nil {
		return nil, feed.Invalid(p+"feeds", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if d := store.Durability(); d != read.Durable {
		return nil, feed.Invalid(p+"store", "is %v; feed %q is written inside the store's commit transaction, and only a durable store opens one", d, f)
	}
	txs, ok := store.(TxStore)
	if !ok {
		return nil, feed.Invalid(p+"store", "(%T) cannot reset a checkpoint inside a transaction (it implements no TxStore), so a reset could not be atomic with feed %q's", store, f)
	}
	var bound read.CheckpointKey
	err := pgx.BeginFunc(ctx, txs, func(tx pgx.Tx) error {
		var err error
		bound.Projection, bound.Partition, err = feeds.BindTx(ctx, tx, f, key.Projection, key.Partition)
		return err
	})
	if err != nil {
		return nil, feed.WriteFailed("binding feed "+string(f), err)
	}
	if bound != key {
		return nil, &FeedBoundError{Feed: f, Bound: bound, Wanted: key}
	}
	return &FeedStore{store: store, tx: txs, feeds: feeds, feed: f, key: key}, nil
}

// Feed is the bound feed.
func (s *FeedStore) Feed() feed.FeedName { return s.feed }

// Key is the checkpoint the feed is bound to.
func (s *FeedStore) Key() read.CheckpointKey { return s.key }

// Durability is the decorated store's: always read.Durable.
func (s *FeedStore) Durability() read.Durability { return s.store.Durability() }

// ReadCheckpoint is the decorated store's.
func (s *FeedStore) ReadCheckpoint(ctx context.Context, key read.CheckpointKey) (read.Checkpoint, error) {
	return s.store.ReadCheckpoint(ctx, key)
}

// Commit is the decorated store's Commit; for the bound key, the feed lock
// is taken in the commit's transaction before apply runs (see WithFeed).
func (s *FeedStore) Commit(ctx context.Context, key read.CheckpointKey, expected read.Checkpoint, next read.Position, apply func(ctx context.Context, tx pgx.Tx) error) error {
	if key != s.key {
		return s.store.Commit(ctx, key, expected, next, apply)
	}
	return s.store.Commit(ctx, key, expected, next, func(ctx context.Context, tx pgx.Tx) error {
		if err := s.feeds.LockTx(ctx, tx, s.feed); err != nil {
			return err
		}
		if apply == nil {
			return nil
		}
		return apply(ctx, tx)
	})
}

// ResetCheckpoint, for the bound key, is Rebuild without a clear function;
// any other key goes to the decorated store untouched.
func (s *FeedStore) ResetCheckpoint(ctx context.Context, key read.CheckpointKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if key != s.key {
		return s.store.ResetCheckpoint(ctx, key)
	}
	_, err := s.Rebuild(ctx, nil)
	return err
}

// Rebuild resets the bound checkpoint to read.Origin and moves the feed to its
// next generation, empty, in one transaction (see WithFeed), running clear in
// that transaction after the checkpoint reset: the place to empty a durable
// view, so no reader ever sees the view emptied with the checkpoint not yet
// reset, or the reverse. It returns the feed's new generation. An error from
// clear is returned unchanged, and nothing of the rebuild lands.
func (s *FeedStore) Rebuild(ctx context.Context, clear func(ctx context.Context, tx pgx.Tx) error) (feed.Generation, error) {
	var gen feed.Generation
	var clearErr error
	err := pgx.BeginFunc(ctx, s.tx, func(tx pgx.Tx) error {
		var err error
		// ResetTx takes the feed lock first, bumps the generation and deletes
		// the feed's rows; the order of that delete and the checkpoint reset
		// does not matter, both being under the feed lock.
		if gen, err = s.feeds.ResetTx(ctx, tx, s.feed); err != nil {
			return err
		}
		if err := s.tx.ResetCheckpointTx(ctx, tx, s.key); err != nil {
			return err
		}
		if clear != nil {
			clearErr = clear(ctx, tx)
			return clearErr
		}
		return nil
	})
	switch {
	case err == nil:
		return gen, nil
	case clearErr != nil && errors.Is(err, clearErr):
		return 0, clearErr
	}
	return 0, feed.WriteFailed(fmt.Sprintf("resetting checkpoint %s and feed %s", s.key.String(), s.feed), err)
}
