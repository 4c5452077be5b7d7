package read

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Event is one recorded event, as an event log hands it to a projection.
type Event struct {
	// Position is the event's place in the whole log: above Origin, strictly
	// ascending in commit order, never reused. A checkpoint is a Position.
	Position Position
	// Stream is the stream the event was appended to, and Version its place
	// in that stream (the stream's first event is version 1).
	Stream  string
	Version int64
	// Type names the event for the projection's dispatch.
	Type string
	// Data is the event's JSON document.
	Data json.RawMessage
	// RecordedAt is when the event was appended, by the database's clock
	// (its commit may come later).
	RecordedAt time.Time
}

// EventSource is what a Runner replays: every event after a position, in
// position order. A source must never hand out, after a read that returned
// position p, an event below p that it did not return then: a checkpoint at p
// would skip it for good.
type EventSource interface {
	ReadAll(ctx context.Context, after Position, limit int) ([]Event, error)
}

// Defaults of RunnerOptions.
const (
	// DefaultRunnerBatch is how many events a Runner applies per commit.
	DefaultRunnerBatch = 500
	// DefaultRunnerPoll is how long an idle Runner waits before it reads the
	// source again.
	DefaultRunnerPoll = time.Second
	// DefaultRunnerBackoffMax caps a Runner's wait after repeated failures.
	DefaultRunnerBackoffMax = 30 * time.Second
)

// RunnerOptions configure a Runner. The zero value is valid and means all
// defaults.
type RunnerOptions struct {
	// Batch is the most events read and applied in one commit, 1 to
	// feed.MaxBatchLimit. Defaults to DefaultRunnerBatch.
	Batch int
	// Poll is how long Run waits, once caught up, before it reads again; the
	// first wait after a failure is Poll as well, doubling up to BackoffMax.
	// Defaults to DefaultRunnerPoll.
	Poll time.Duration
	// BackoffMax caps the wait after repeated failures; at least Poll.
	// Defaults to DefaultRunnerBackoffMax, or Poll when that is larger.
	BackoffMax time.Duration
	// Clock is the time Run's waits run on. Defaults to feed.SystemClock.
	Clock feed.Clock
	// Logger receives the failures Run backs off from. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Apply is a projection's handler: it applies events, in order, inside the
// commit's transaction, writing the view (and, for a feed, calling the feed
// writer with tx). It must not commit or roll back tx.
type Apply[Tx any] func(ctx context.Context, tx Tx, events []Event) error

// Runner keeps one projection up to date: it reads the events after the
// checkpoint in batches and commits each batch with Store.Commit, so a
// batch's writes and the checkpoint move land together or not at all. It
// holds no state of its own between batches: the checkpoint is the only
// record of progress, so a Runner stopped at any point (its context ended, its
// process killed) and a new one started later resume exactly after the last
// batch that committed. Two Runners of one key may run at once; the
// checkpoint's compare-and-set lets one of them land each batch and the other
// reads again.
type Runner[Tx any] struct {
	source EventSource
	store  ProjectionStore[Tx]
	key    CheckpointKey
	apply  Apply[Tx]
	opts   RunnerOptions
}

// NewRunner returns a runner of key over source and store, or an
// *feed.InvalidError naming what is wrong.
func NewRunner[Tx any](source EventSource, store ProjectionStore[Tx], key CheckpointKey, apply Apply[Tx], opts RunnerOptions) (*Runner[Tx], error) {
	const p = "runner."
	switch {
	case source == nil:
		return nil, feed.Invalid(p+"source", "must not be nil")
	case store == nil:
		return nil, feed.Invalid(p+"store", "must not be nil")
	case apply == nil:
		return nil, feed.Invalid(p+"apply", "must not be nil")
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	switch {
	case opts.Batch < 0 || opts.Batch > feed.MaxBatchLimit:
		return nil, feed.Invalid(p+"batch", "is %d; it must be 1 to %d (0 for the default %d)", opts.Batch, feed.MaxBatchLimit, DefaultRunnerBatch)
	case opts.Batch == 0:
		opts.Batch = DefaultRunnerBatch
	}
	switch {
	case opts.Poll < 0:
		return nil, feed.Invalid(p+"poll", "is %v; durations must be positive", opts.Poll)
	case opts.Poll == 0:
		opts.Poll = DefaultRunnerPoll
	}
	switch {
	case opts.BackoffMax < 0:
		return nil, feed.Invalid(p+"backoff_max", "is %v; durations must be positive", opts.BackoffMax)
	case opts.BackoffMax == 0:
		opts.BackoffMax = max(DefaultRunnerBackoffMax, opts.Poll)
	case opts.BackoffMax < opts.Poll:
		return nil, feed.Invalid(p+"backoff_max", "(%v) must be at least poll (%v)", opts.BackoffMax, opts.Poll)
	}
	if opts.Clock == nil {
		opts.Clock = feed.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Runner[Tx]{source: source, store: store, key: key, apply: apply, opts: opts}, nil
}

// Step reads the next batch after the checkpoint and commits it. It returns
// how many events it applied: 0 when the projection is caught up. A batch that
// loses the checkpoint's compare-and-set (a rival runner landed first, or a
// reset moved the checkpoint back) applies nothing and returns a
// *CheckpointSupersededError; the next Step reads the checkpoint again.
func (r *Runner[Tx]) Step(ctx context.Context) (int, error) {
	at, err := r.store.ReadCheckpoint(ctx, r.key)
	if err != nil {
		return 0, err
	}
	events, err := r.source.ReadAll(ctx, at.Position, r.opts.Batch)
	if err != nil || len(events) == 0 {
		return 0, err
	}
	last := events[len(events)-1].Position
	if last <= at.Position {
		return 0, fmt.Errorf("read: event source handed out position %d after %d", last, at.Position)
	}
	if err := r.store.Commit(ctx, r.key, at, last, func(ctx context.Context, tx Tx) error {
		return r.apply(ctx, tx, events)
	}); err != nil {
		return 0, err
	}
	return len(events), nil
}

// MaxResetsInARow bounds how many batches in a row CatchUp retries at once
// after losing the checkpoint's compare-and-set to a reset (the checkpoint
// found in a later epoch, or not ahead of where this runner read it). A loss
// to a rival runner that moved the checkpoint forward is progress, made by
// the rival, and is always retried at once; one reset is the normal cost of a
// rebuild. A run of resets means something resets the checkpoint as fast as
// this runner reads, and retrying without pause would spin against it:
// CatchUp then returns the last *CheckpointSupersededError, so Run backs off.
const MaxResetsInARow = 16

// CatchUp steps until the projection is caught up with the source as read at
// its last step, retrying a superseded batch at once (up to MaxResetsInARow
// losses to resets in a row). It returns how many events it applied, and
// stops at the first other error.
func (r *Runner[Tx]) CatchUp(ctx context.Context) (int, error) {
	total, resets := 0, 0
	for {
		n, err := r.Step(ctx)
		total += n
		switch {
		case errors.Is(err, ErrCheckpointSuperseded):
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			var sup *CheckpointSupersededError
			forward := errors.As(err, &sup) && sup.Actual.Epoch == sup.Expected.Epoch && sup.Actual.Position > sup.Expected.Position
			if !forward {
				if resets++; resets >= MaxResetsInARow {
					return total, err
				}
			}
			continue
		case err != nil:
			return total, err
		case n == 0:
			return total, nil
		}
		resets = 0
	}
}

// Run catches up, waits Poll, and again, until ctx ends; then it returns
// ctx's error. A failure (the database unreachable, apply refusing an event)
// is logged and retried after a backoff, never skipped: a projection that
// skipped an event would be wrong for good.
func (r *Runner[Tx]) Run(ctx context.Context) error {
	failures := 0
	for {
		_, err := r.CatchUp(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := r.opts.Poll
		if err != nil {
			failures++
			wait = min(r.opts.BackoffMax, r.opts.Poll<<min(failures-1, 20))
			r.opts.Logger.Warn("read: projection runner failed; retrying", "checkpoint", r.key.String(), "failures", failures, "retry_in", wait, "error", err)
		} else {
			failures = 0
		}
		t := r.opts.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}
