package syncer

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// DefaultWaitPollInterval is how long a waiter waits for a cursor wake-up
// before it reads the cursors anyway. Waits are short (a request's deadline)
// and wake-ups carry the latency, so a second is slow enough to cost nothing
// and quick enough to cover a lost wake-up within a request.
const DefaultWaitPollInterval = time.Second

// WaitOptions configure WaitApplied and WaitAppliedAll. The zero value is
// valid and means every default.
type WaitOptions struct {
	// PollInterval is how long a waiter waits for a cursor wake-up before it
	// reads the cursors anyway; see DefaultWaitPollInterval. Defaults to
	// DefaultWaitPollInterval.
	PollInterval time.Duration
	// Clock is the time the poll runs on. The wait's deadline is ctx's.
	// Defaults to feed.SystemClock.
	Clock feed.Clock
}

func (o WaitOptions) resolve() (WaitOptions, error) {
	switch {
	case o.PollInterval < 0:
		return o, feed.Invalid("wait.poll_interval", "is %v; durations must be positive", o.PollInterval)
	case o.PollInterval == 0:
		o.PollInterval = DefaultWaitPollInterval
	}
	if o.Clock == nil {
		o.Clock = feed.SystemClock{}
	}
	return o, nil
}

// Outcome is how a wait for one sink ended.
type Outcome string

const (
	// OutcomePending: the wait ended (its context did) before the sink's
	// cursor decided anything.
	OutcomePending Outcome = ""
	// OutcomeApplied: the sink's cursor is of the write's generation and at
	// or past its last seq, and none of the write's records is parked: the
	// sink holds the write, or a newer version of each of its keys.
	OutcomeApplied Outcome = "applied"
	// OutcomeParked: as applied, but the sink refused some of the write's
	// records, which WaitResult.Parked lists with the sink's reasons. The rest
	// of the write was applied.
	OutcomeParked Outcome = "parked"
	// OutcomeSuperseded: the sink's cursor moved on to a later generation: a
	// rebuild replaced the generation the write was of, and the sink
	// published a copy of the rebuilt feed, which holds the write's effect
	// only if the rebuilt read model does.
	OutcomeSuperseded Outcome = "superseded"
)

// WaitResult is what a wait found for one sink.
type WaitResult struct {
	ID      feed.SinkID
	Outcome Outcome
	// Cursor is the sink's cursor as the wait last read it; the zero Cursor
	// when the sink had none (or was not registered).
	Cursor feed.Cursor
	// Parked are, for OutcomeParked, the sink's parked records whose seq lies
	// in the write's range: the write's own versions the sink refused, in key
	// order. A key the write changed and a later write changed again is
	// judged by that later write, not here.
	Parked []feed.ParkedRecord
}

// target is what a wait waits for: the sink's cursor at generation gen and
// seq last or later; parked records with a seq in [first, last] are the
// wait's own.
type target struct {
	gen         feed.Generation
	first, last feed.Seq
}

// targetOf checks a write's result and makes it a target. ok is false for an
// empty write (First = Last = 0), which has nothing to wait for.
func targetOf(w feed.WriteResult) (t target, ok bool, err error) {
	switch {
	case w.First == 0 && w.Last == 0:
		return target{}, false, nil
	case w.Generation < feed.FirstGeneration:
		return t, false, feed.Invalid("write.generation", "is %d; generations start at 1", w.Generation)
	case w.First < 1:
		return t, false, feed.Invalid("write.first", "is %d; a write's first seq is at least 1", w.First)
	case w.Last < w.First:
		return t, false, feed.Invalid("write.last", "is %d, below write.first (%d)", w.Last, w.First)
	}
	return target{gen: w.Generation, first: w.First, last: w.Last}, true, nil
}

// WaitApplied waits until the sink id has applied the write w, as its Write
// returned it, and says how: applied, parked for this sink (which records,
// with the reasons) or superseded by a rebuild; see Outcome. It is woken by
// the store's cursor moves when the store is a feed.CursorWatcher (the
// package doc, "Reading your writes", says why), and reads the cursor at every wake-up and every
// opts.PollInterval. It runs no worker and needs none in this process: any
// process that moves the sink's cursor through the same database wakes it.
//
// It returns when the outcome is known, or when ctx ends, promptly, with
// ctx's error (matching context.DeadlineExceeded or context.Canceled) and the
// result so far (OutcomePending). A sink that is not registered, or whose
// worker never runs, stays pending. An empty write (First = Last = 0) is
// applied at once. A store fault is returned as it came (feed.ErrUnreadable);
// waiting again is safe.
func WaitApplied(ctx context.Context, store feed.SyncStore, id feed.SinkID, w feed.WriteResult, opts WaitOptions) (WaitResult, error) {
	if store == nil {
		return WaitResult{ID: id}, feed.Invalid("store", "must not be nil")
	}
	if err := id.Validate(); err != nil {
		return WaitResult{ID: id}, err
	}
	w, err := sealedWrite(ctx, store, id.Feed, w)
	if err != nil {
		return WaitResult{ID: id}, err
	}
	t, ok, err := targetOf(w)
	if err != nil || !ok {
		return WaitResult{ID: id, Outcome: applied(ok, err)}, err
	}
	opts, err = opts.resolve()
	if err != nil {
		return WaitResult{ID: id}, err
	}
	out, err := wait(ctx, store, id.Feed, []feed.SinkID{id}, []target{t}, opts)
	return out[0], err
}

// SealWaiter is a store whose concurrent-mode writes get their seqs after
// they commit (pgfeed.Store): SealedRange says whether the keys of such a
// write are sealed and, once they are, the seqs their rows hold.
type SealWaiter interface {
	SealedRange(ctx context.Context, f feed.FeedName, keys []feed.Key) (gen feed.Generation, first, last feed.Seq, sealed bool, err error)
}

// sealPoll is how often a wait for a concurrent-mode write asks whether its
// keys are sealed: a sealer seals within milliseconds while writes come, so
// a wait asks a few times.
const sealPoll = 5 * time.Millisecond

// sealedWrite turns a concurrent-mode write (Unsealed keys, no seqs) into
// the write its wait is for, once the store has sealed its keys: the range
// of the seqs their rows then hold, the write's own or later writes' (a
// later write of a key makes the wait wait for that write too, and is
// judged with it). A wait for such a write therefore first waits for the
// sealer, then for the sinks as for any write; its Parked may also list
// records of other writes whose seqs fell in that range. When the feed's
// generation moved on meanwhile, or no key has a row left, the write is
// judged at its generation's first seq: a sink past it in that generation
// applied it, one in a later generation finds it superseded. A store that
// is no SealWaiter cannot resolve it, which is a caller's mistake.
func sealedWrite(ctx context.Context, store feed.SyncStore, f feed.FeedName, w feed.WriteResult) (feed.WriteResult, error) {
	if len(w.Unsealed) == 0 {
		return w, nil
	}
	if w.First != 0 || w.Last != 0 {
		return w, feed.Invalid("write.unsealed", "lists %d keys beside seqs %d..%d; a write has either", len(w.Unsealed), w.First, w.Last)
	}
	sw, ok := store.(SealWaiter)
	if !ok {
		return w, feed.Invalid("store", "cannot tell when the keys of a concurrent-mode write are sealed (it is no syncer.SealWaiter)")
	}
	for {
		gen, first, last, sealed, err := sw.SealedRange(ctx, f, w.Unsealed)
		if err != nil {
			if ctx.Err() != nil {
				return w, waitEnded(ctx, f)
			}
			return w, err
		}
		if sealed {
			if gen != w.Generation || first == 0 {
				first, last = 1, 1
			}
			return feed.WriteResult{Generation: w.Generation, First: first, Last: last}, nil
		}
		t := time.NewTimer(sealPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return w, waitEnded(ctx, f)
		case <-t.C:
		}
	}
}

// applied is the outcome of a wait that did not start: applied for an empty
// write, nothing for a refused one.
func applied(started bool, err error) Outcome {
	if err == nil && !started {
		return OutcomeApplied
	}
	return OutcomePending
}

// WaitAppliedAll is WaitApplied for every sink of feed f: the sinks registered
// (with a cursor or not) when the call starts, as Describe lists them, in
// name order. A sink registered later is not waited for; one removed meanwhile
// stays pending. With no sink registered it returns no result at once. On an
// error the results are those known so far, the rest pending.
func WaitAppliedAll(ctx context.Context, store feed.SyncStore, f feed.FeedName, w feed.WriteResult, opts WaitOptions) ([]WaitResult, error) {
	if store == nil {
		return nil, feed.Invalid("store", "must not be nil")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	w, err := sealedWrite(ctx, store, f, w)
	if err != nil {
		return nil, err
	}
	t, ok, err := targetOf(w)
	if err != nil {
		return nil, err
	}
	if opts, err = opts.resolve(); err != nil {
		return nil, err
	}
	d, err := store.Describe(ctx, f)
	if err != nil {
		return nil, err
	}
	ids := make([]feed.SinkID, len(d.Sinks))
	targets := make([]target, len(d.Sinks))
	for i, s := range d.Sinks {
		ids[i], targets[i] = feed.SinkID{Feed: f, Sink: s.Sink}, t
	}
	if !ok {
		out := make([]WaitResult, len(ids))
		for i, id := range ids {
			out[i] = WaitResult{ID: id, Outcome: OutcomeApplied}
		}
		return out, nil
	}
	return wait(ctx, store, f, ids, targets, opts)
}

// WaitCaughtUp waits until every target of the runner has applied its feed's
// head as read when the call starts (each feed's generation and head read in
// one snapshot), and returns a result per target, in the order of the
// targets: WaitApplied's special case for the write that spans the whole feed,
// so its Parked lists every record of that generation parked for the sink.
// The runner need not be running in this process; the targets' workers may
// run anywhere. It polls at the runner's Options.PollInterval, on its Clock,
// between cursor wake-ups. When ctx ends it returns ctx's error and the
// results so far.
func (r *Runner) WaitCaughtUp(ctx context.Context) ([]WaitResult, error) {
	opts := WaitOptions{PollInterval: r.opts.PollInterval, Clock: r.opts.Clock}
	out := make([]WaitResult, len(r.workers))
	byFeed := map[feed.FeedName][]int{}
	var feeds []feed.FeedName
	for i, w := range r.workers {
		out[i].ID = w.id
		if byFeed[w.id.Feed] == nil {
			feeds = append(feeds, w.id.Feed)
		}
		byFeed[w.id.Feed] = append(byFeed[w.id.Feed], i)
	}
	for _, f := range feeds {
		// A read after the largest seq returns no record, only the
		// generation and the head, from one snapshot.
		b, err := r.store.ReadBatch(ctx, f, math.MaxInt64, feed.BatchLimit{Records: 1})
		if err != nil {
			return out, err
		}
		t := target{gen: b.Generation, first: 1, last: b.Head}
		idx := byFeed[f]
		ids := make([]feed.SinkID, len(idx))
		targets := make([]target, len(idx))
		for j, i := range idx {
			ids[j], targets[j] = r.workers[i].id, t
		}
		res, err := wait(ctx, r.store, f, ids, targets, opts)
		for j, i := range idx {
			out[i] = res[j]
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// wait reads the cursors of ids (all of feed f) until each has decided its
// target, subscribing to the feed's cursor moves first, so that a move after
// a read always wakes the wait that follows it.
func wait(ctx context.Context, store feed.SyncStore, f feed.FeedName, ids []feed.SinkID, targets []target, opts WaitOptions) ([]WaitResult, error) {
	out := make([]WaitResult, len(ids))
	for i, id := range ids {
		out[i].ID = id
	}
	var woken <-chan struct{} // nil, never ready, without a subscription
	if cw, ok := store.(feed.CursorWatcher); ok {
		sub, err := cw.SubscribeCursors(ctx, f)
		switch {
		case err == nil:
			defer sub.Close()
			woken = sub.C()
		case ctx.Err() != nil:
			return out, waitEnded(ctx, f)
		}
		// Otherwise poll only: a lost wake-up costs latency, never the answer.
	}
	for {
		left := 0
		for i := range out {
			if out[i].Outcome != OutcomePending {
				continue
			}
			if err := decide(ctx, store, &out[i], targets[i]); err != nil {
				if ctx.Err() != nil {
					return out, waitEnded(ctx, f)
				}
				return out, err
			}
			if out[i].Outcome == OutcomePending {
				left++
			}
		}
		if left == 0 {
			return out, nil
		}
		t := opts.Clock.NewTimer(opts.PollInterval)
		select {
		case <-woken:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return out, waitEnded(ctx, f)
		}
		t.Stop()
	}
}

// decide reads one sink's cursor, and its parked list once the cursor has
// passed the target, and sets r's outcome when they decide it. The two reads
// are two snapshots, which is safe: once the cursor has passed the target,
// later moves change the parked list only for seqs above the target (newer
// versions, or a new generation's), or unpark a key whose newer version the
// sink took, which leaves the write applied.
func decide(ctx context.Context, store feed.SyncStore, r *WaitResult, t target) error {
	c, err := store.ReadCursor(ctx, r.ID)
	if err != nil {
		return err
	}
	r.Cursor = c
	switch {
	case c.Generation > t.gen:
		r.Outcome = OutcomeSuperseded
	case c.Generation == t.gen && c.Seq >= t.last:
		parked, err := store.ReadParked(ctx, r.ID)
		if err != nil {
			return err
		}
		r.Parked = nil
		for _, p := range parked {
			if p.Seq >= t.first && p.Seq <= t.last {
				r.Parked = append(r.Parked, p)
			}
		}
		r.Outcome = OutcomeApplied
		if len(r.Parked) > 0 {
			r.Outcome = OutcomeParked
		}
	}
	return nil
}

func waitEnded(ctx context.Context, f feed.FeedName) error {
	return fmt.Errorf("syncer: waiting for the sinks of feed %q: %w", f, ctx.Err())
}
