package syncer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kairos-es/kairos/feed"
)

// Target is one (feed, sink) pair a Runner keeps in step.
type Target struct {
	ID   feed.SinkID
	Sink feed.Sink
}

// Runner supervises one Worker per Target, each on its own goroutine, under
// one context. Many runners, in one process or many, may run over the same
// targets: the lease decides which worker sends to each sink.
type Runner struct {
	workers []*Worker
	store   feed.Store // for WaitCaughtUp
	opts    Options    // resolved
	running atomic.Bool
}

// NewRunner builds a runner over store for targets, every worker with opts.
// A target list must not be empty nor name one sink twice.
func NewRunner(store feed.Store, targets []Target, opts Options) (*Runner, error) {
	switch {
	case store == nil:
		return nil, feed.Invalid("store", "must not be nil")
	case len(targets) == 0:
		return nil, feed.Invalid("targets", "must not be empty")
	}
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	seen := make(map[feed.SinkID]int, len(targets))
	r := &Runner{store: store, opts: opts}
	for i, t := range targets {
		field := fmt.Sprintf("targets[%d]", i)
		if err := t.ID.Feed.Validate(); err != nil {
			return nil, renamed(err, field+".id.feed")
		}
		if err := t.ID.Sink.Validate(); err != nil {
			return nil, renamed(err, field+".id.sink")
		}
		if t.Sink == nil {
			return nil, feed.Invalid(field+".sink", "must not be nil")
		}
		if j, ok := seen[t.ID]; ok {
			return nil, feed.Invalid(field+".id", "%v is already targets[%d]; one worker per sink", t.ID, j)
		}
		seen[t.ID] = i
		r.workers = append(r.workers, newWorker(store, t.ID, t.Sink, opts))
	}
	return r, nil
}

// renamed gives an *feed.InvalidError the field name the caller knows.
func renamed(err error, field string) error {
	var ie *feed.InvalidError
	if errors.As(err, &ie) {
		return &feed.InvalidError{Field: field, Reason: ie.Reason, Err: ie.Err}
	}
	return err
}

// Run starts every worker and blocks until ctx ends and every worker has
// stopped and released its lease; then it returns nil. A worker never stops on
// a fault, so neither does the runner. It returns an error only when the
// runner is already running.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("syncer: the runner is already running")
	}
	defer r.running.Store(false)
	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Go(func() { _ = w.Run(ctx) })
	}
	if sl, ok := r.store.(Sealer); ok {
		seen := map[feed.FeedName]bool{}
		for _, w := range r.workers {
			if f := w.id.Feed; !seen[f] {
				seen[f] = true
				wg.Go(func() { _ = sl.RunSealer(ctx, f) })
			}
		}
	}
	wg.Wait()
	return nil
}

// Sealer is a store with feeds in a concurrent write mode, whose writes get
// their seqs from a sealer after they commit (pgfeed.Store). A Runner over
// such a store runs RunSealer for each feed of its targets beside the
// workers, so a daemon seals without configuration of its own: the store's
// sealer lease lets one process at a time seal a feed, and a feed in the
// locked mode costs a look at its mode now and then.
type Sealer interface {
	RunSealer(ctx context.Context, f feed.FeedName) error
}

// States returns a snapshot of every worker, in the order of the targets.
func (r *Runner) States() []State {
	out := make([]State, len(r.workers))
	for i, w := range r.workers {
		out[i] = w.State()
	}
	return out
}

// Worker returns the worker of id, or nil when the runner has none.
func (r *Runner) Worker(id feed.SinkID) *Worker {
	for _, w := range r.workers {
		if w.id == id {
			return w
		}
	}
	return nil
}
