package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// releaseTimeout bounds the lease release and the abort of an unfinished
// resync target once the worker's context has ended.
const releaseTimeout = 5 * time.Second

// subscribeTimeout caps how long a worker waits for its subscription to the
// feed's wake-ups, which is also never longer than its poll interval: waiting
// longer for a wake-up source than for the poll it only shortens gains
// nothing.
const subscribeTimeout = 5 * time.Second

// SinkError is a failed sink call: the sink returned an error, panicked, or
// broke its contract (a rejection of a record it was not sent). The worker
// treats it as an infrastructure fault: it backs off and sends again, and the
// cursor does not move meanwhile.
type SinkError struct {
	ID feed.SinkID
	// Op is the call: "apply", "open resync", "apply resync", "set resync
	// floor" or "publish".
	Op  string
	Err error
}

func (e *SinkError) Error() string {
	return fmt.Sprintf("feed %q sink %q: %s: %v", e.ID.Feed, e.ID.Sink, e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *SinkError) Unwrap() error { return e.Err }

// errGenerationMoved restarts a resync whose feed moved to a new generation
// while it streamed. It is not a fault: the resync starts again at once.
var errGenerationMoved = errors.New("generation moved during the resync")

// Worker keeps one sink in step with one feed. Build one with NewWorker and
// call Run; a Runner supervises many.
//
// # The state machine
//
//	acquiring ─ held by a rival ─▶ standby ─ jittered wait ─▶ acquiring
//	acquiring ─ taken ─▶ read cursor and parked list
//	  cursor absent or of an older generation ─▶ resyncing ─ published ─▶ sending
//	  otherwise ─▶ sending ─ nothing after the cursor ─▶ idle ─ wake-up or poll ─▶ sending
//	  any fault ─▶ backoff ─▶ re-read cursor and parked list, carry on under the same lease
//	  lease lost or cursor superseded ─▶ release the lease ─▶ acquiring
//	  context ended ─▶ release the lease ─▶ stopped
//
// A batch whose generation is newer than the cursor's sends the worker to
// resyncing; a resync whose feed moves on mid-stream aborts its target and
// starts again.
//
// # What it logs
//
// Every line carries the feed and the sink. At INFO, so that an operator can
// follow a worker without drowning in it:
//   - standby: one line when the lease is refused, naming the holder and when
//     its lease can lapse, and another only when the store names a different
//     holder, however many retries in between;
//   - one line each time it takes the lease, and one when it loses it;
//   - a resync's and a catch-up's progress (rows the sink took, rate, seqs left at
//     most, the time that should take), at most once per
//     Options.ProgressInterval on the worker's clock; a resync ends with one
//     line giving its total and duration, and so does a catch-up long enough
//     to have logged its progress (a catch-up begins with a batch that comes
//     back full and ends with one that does not);
//   - one line when it gets work done again after a fault.
//
// Faults are logged at WARN, each time (State keeps the last one). A sink
// that panics is logged at ERROR with its stack the first time it panics at
// a given place in its code, and with a one-line count, without the stack, at
// each later panic there, so that a panic on every retry does not fill the
// log with one stack per retry.
//
// The package doc states what a worker guarantees and how it fails.
type Worker struct {
	id      feed.SinkID
	reader  feed.Reader
	store   feed.SyncStore
	sink    feed.Sink
	opts    Options
	log     *slog.Logger
	running atomic.Bool

	// sinkTimeout is the deadline of a sink call under the lease held now,
	// set at the start of each session; only the worker's goroutine uses it.
	sinkTimeout time.Duration
	// panicSites counts the sink's panics by the place in its code they came
	// from; only the worker's goroutine uses it. See call.
	panicSites map[string]int

	mu    sync.Mutex
	state State
}

// NewWorker builds a worker that mirrors the feed id.Feed into sink, whose
// cursor, parked list and lease store keeps under id (a *pgfeed.Store or a
// *memfeed.Store).
func NewWorker(store feed.Store, id feed.SinkID, sink feed.Sink, opts Options) (*Worker, error) {
	switch {
	case store == nil:
		return nil, feed.Invalid("store", "must not be nil")
	case sink == nil:
		return nil, feed.Invalid("sink", "must not be nil")
	}
	if err := id.Validate(); err != nil {
		return nil, err
	}
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	return newWorker(store, id, sink, opts), nil
}

// newWorker builds a worker from resolved options.
func newWorker(store feed.Store, id feed.SinkID, sink feed.Sink, opts Options) *Worker {
	return &Worker{
		id:     id,
		reader: store,
		store:  store,
		sink:   sink,
		opts:   opts,
		log:    opts.Logger.With("feed", string(id.Feed), "sink", string(id.Sink)),
		state:  State{ID: id, Phase: PhaseStarting},
	}
}

// ID is the sink the worker keeps in step.
func (w *Worker) ID() feed.SinkID { return w.id }

// State returns a snapshot of the worker. It takes a lock the worker holds only
// to copy figures in, never across a call, so it does not wait on the worker's
// work.
func (w *Worker) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

func (w *Worker) update(f func(*State)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.state)
}

func (w *Worker) setPhase(p Phase) { w.update(func(s *State) { s.Phase = p }) }

// Run keeps the sink in step until ctx ends, then releases the lease and
// returns nil. It never returns on a fault: it backs off and tries again. It
// returns an error only when the worker is already running.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("syncer: the worker of %v is already running", w.id)
	}
	defer w.running.Store(false)
	defer w.update(func(s *State) {
		s.Phase = PhaseStopped
		s.LeaseHeld, s.Holder = false, ""
		s.WaitingFor, s.WaitingUntil = "", time.Time{}
	})
	failures := 0
	var waiting *feed.LeaseHeldError // the refusal last logged in this standby; nil outside one
	for ctx.Err() == nil {
		w.setPhase(PhaseAcquiring)
		// The lease lives until its context ends, and a store clears the row
		// the moment it does. Were that ctx, shutdown would free the sink while
		// a call of this worker is still in flight, and a rival could send
		// beside it. So the lease gets a context of its own, cancelled with ctx
		// only while the take itself runs, and ended after the release.
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		unlink := context.AfterFunc(ctx, cancel)
		lease, err := w.store.AcquireLease(lctx, w.id)
		unlink()
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, feed.ErrLeaseHeld) {
				failures = 0
				waiting = w.standby(ctx, err, waiting)
				w.sleep(ctx, jitter(w.opts.LeaseRetry, 0.5, 1.5))
				continue
			}
			failures++
			w.fault(ctx, fmt.Errorf("taking the lease: %w", err))
			w.backoff(ctx, failures, 0)
			continue
		}
		waiting = nil
		progressed := w.session(ctx, lease)
		w.release(ctx, lease)
		cancel()
		// A lease lost before the session got anything done counts as a
		// fault, so a store whose leases do not hold makes the worker back
		// off instead of spinning on take and release.
		if progressed {
			failures = 0
		} else if ctx.Err() == nil {
			failures++
			w.backoff(ctx, failures, 0)
		}
	}
	return nil
}

// standby records a refused take in the state and logs it when it is the
// first of this standby or names another holder than the last one logged (a
// store that says nothing of the holder logs once). It returns the refusal now
// logged.
func (w *Worker) standby(ctx context.Context, err error, logged *feed.LeaseHeldError) *feed.LeaseHeldError {
	held := &feed.LeaseHeldError{ID: w.id}
	errors.As(err, &held)
	w.update(func(st *State) {
		st.Phase = PhaseStandby
		st.WaitingFor, st.WaitingUntil = held.Holder, held.ExpiresAt
	})
	if logged != nil && logged.Holder == held.Holder {
		return logged
	}
	attrs := []any{"holder", string(held.Holder), "retry_every", w.opts.LeaseRetry}
	switch {
	case held.Holder == "":
		attrs = append(attrs, "lapses", "unknown: the store did not name the holder")
	case held.ExpiresAt.IsZero():
		attrs = append(attrs, "lapses", "when the holder's session ends (an advisory lock)")
	default:
		attrs = append(attrs, "lapses_at", held.ExpiresAt)
	}
	w.log.Log(ctx, slog.LevelInfo, "feed lease held by another worker; waiting for it", attrs...)
	return held
}

// release gives the lease up, even when ctx has ended: a worker shutting down
// frees the sink at once rather than leave the lease to lapse.
func (w *Worker) release(ctx context.Context, lease feed.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		w.log.Warn("feed lease release failed; it will lapse", "holder", string(lease.Holder()), "error", err)
	}
	w.update(func(s *State) { s.LeaseHeld = false; s.Holder = "" })
}

// session is one lease's worth of work. The cursor and the parked list are
// read at the start and after every fault, and kept in step with the worker's
// own moves in between: only the lease holder moves them (an operator's retry
// only unparks, which leaves the worker's view a superset, and unparking a key
// that is not parked is harmless).
type session struct {
	w        *Worker
	lease    feed.Lease
	sub      feed.Subscription // nil while subscribing fails
	subRetry time.Time         // when to try subscribing again
	fresh    bool              // cursor and parked were read since the last fault
	cursor   feed.Cursor       // as the store has it: read, or last moved by this session
	// applied is where the sink stands while it is ahead of the cursor: the
	// end of the last batch it applied whose move is put off (see
	// Options.MoveInterval). Zero when the cursor is where the sink stands.
	applied feed.Cursor
	// unmoved counts the records the sink took in the batches up to applied,
	// for State.RecordsApplied once their move lands; zero with applied.
	unmoved int64
	movedAt time.Time // when this session's last move landed, on the worker's clock
	parked  map[feed.Key]feed.Seq
	ahead   *readAhead // the batch after the one being sent, read meanwhile; nil when none
	// records is the record limit of the next read (see limit): BatchSize,
	// or fewer while batches come back cut by bytes. 0 until the first read.
	records int
	prog    *progress // the resync or catch-up under way, for the log; nil when none
}

// progress is one resync's or catch-up's account, for the progress lines the
// Worker's doc describes. Times are on the worker's clock.
type progress struct {
	what     string // "resync" or "catch-up"
	began    time.Time
	loggedAt time.Time // the last progress line, or began
	rows     int64     // records the sink took in it
	lines    int       // progress lines logged
}

// readAhead is the batch after seq after, read while the worker sends the
// batch that ends at after and moves the cursor past it. Where the next read
// starts depends only on the last seq of the batch before, not on the sink's
// answer nor on the move, so the worker reads the feed back to back while the
// sink and the cursor take their time: a catch-up runs at the pace of the
// slower of the two rather than of their sum. It costs one batch more in
// memory. A read ahead is used only by a read after the same seq, and the sink
// still gets it only after the batch before it was applied and its move landed;
// any other read, after a fault or a lease change, throws it away. Each read
// ahead starts after the read before it returned, so the batches of one stream
// are still read in snapshots that follow one another, as the resync argument
// in the package doc requires.
type readAhead struct {
	after feed.Seq
	limit feed.BatchLimit // what it was read with
	done  chan struct{}
	batch feed.Batch
	err   error
}

// session works under one lease until the lease is gone or ctx ends. It
// reports whether any step succeeded.
func (w *Worker) session(ctx context.Context, lease feed.Lease) (progressed bool) {
	s := &session{w: w, lease: lease}
	defer func() {
		s.dropAhead()
		// A move put off lands before the lease goes, even on shutdown, so
		// the next holder does not send those batches again. Refused (the
		// lease is gone) or failed, it only costs that resend.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		s.tryFlush(fctx)
		cancel()
		if s.sub != nil {
			s.sub.Close()
			w.update(func(st *State) { st.WakeUps = false })
		}
	}()
	w.sinkTimeout = w.sinkTimeoutFor(lease)
	w.update(func(st *State) {
		st.LeaseHeld, st.Holder = true, lease.Holder()
		st.WaitingFor, st.WaitingUntil = "", time.Time{}
	})
	w.log.Info("feed lease taken", "holder", string(lease.Holder()))
	w.recovered(ctx)
	failures := 0
	for ctx.Err() == nil {
		idle, err := s.step(ctx)
		switch {
		case err == nil:
			failures = 0
			progressed = true
			w.recovered(ctx)
			if idle {
				s.wait(ctx)
			}
		case ctx.Err() != nil:
			return
		case errors.Is(err, feed.ErrLeaseLost) || errors.Is(err, feed.ErrCursorSuperseded):
			w.fault(ctx, err)
			w.log.Info("feed lease gone; the worker stops sending and takes it again", "holder", string(lease.Holder()), "error", err)
			return
		default:
			// Land what the sink already took before backing off, so that
			// the retry starts after it; a store at fault refuses this too,
			// and the batches are then sent again.
			s.tryFlush(ctx)
			s.fresh = false
			failures++
			w.fault(ctx, err)
			// A sink that said when to come back (feed.RetryDelayer: an
			// HTTP 429's Retry-After) is not sent to before then.
			w.backoff(ctx, failures, feed.RetryDelay(err))
		}
	}
	return progressed
}

// step does one unit of work: a resync, one incremental batch, or finding the
// sink caught up (idle).
func (s *session) step(ctx context.Context) (idle bool, err error) {
	w := s.w
	if s.sub == nil && !w.opts.Clock.Now().Before(s.subRetry) {
		// Subscribe before reading, so a commit after this read wakes the
		// wait. A worker that cannot subscribe still polls: wake-ups only
		// shorten the wait, so their loss costs latency, never progress. So
		// the subscribe is bounded (subscribeTimeout), and a worker whose
		// wake-up source is down or does not answer polls and tries again a
		// poll interval later.
		bound := min(w.opts.PollInterval, subscribeTimeout)
		sctx, cancel := context.WithTimeout(ctx, bound)
		sub, err := w.reader.Subscribe(sctx, w.id.Feed)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return false, err
			}
			if errors.Is(sctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("no answer within %v: %w", bound, err)
			}
			err = fmt.Errorf("subscribing to the feed (polling every %v meanwhile): %w", w.opts.PollInterval, err)
			w.update(func(st *State) { st.WakeUps = false; st.WakeUpError = err })
			w.fault(ctx, err)
			s.subRetry = w.opts.Clock.Now().Add(w.opts.PollInterval)
		} else {
			s.sub = sub
			w.update(func(st *State) { st.WakeUps = true; st.WakeUpError = nil })
		}
	}
	if !s.fresh {
		var cursor feed.Cursor
		err := w.storeCall(ctx, "reading the cursor", func(ctx context.Context) (err error) {
			cursor, err = w.store.ReadCursor(ctx, w.id)
			return err
		})
		if err != nil {
			return false, err
		}
		var parked []feed.ParkedRecord
		err = w.storeCall(ctx, "reading the parked records", func(ctx context.Context) (err error) {
			parked, err = w.store.ReadParked(ctx, w.id)
			return err
		})
		if err != nil {
			return false, err
		}
		s.cursor, s.applied, s.unmoved = cursor, feed.Cursor{}, 0
		s.parked = make(map[feed.Key]feed.Seq, len(parked))
		for _, p := range parked {
			s.parked[p.Key] = p.Seq
		}
		s.fresh = true
		w.update(func(st *State) { st.Cursor = cursor; st.Parked = len(s.parked) })
	}
	if s.cursor.IsZero() {
		return false, s.resync(ctx)
	}
	batch, err := s.read(ctx, s.position().Seq)
	if err != nil {
		return false, err
	}
	switch {
	case batch.Generation > s.cursor.Generation:
		s.applied, s.unmoved = feed.Cursor{}, 0 // the resync's move replaces everything
		return false, s.resync(ctx)
	case batch.Generation < s.cursor.Generation:
		return false, fmt.Errorf("the sink's cursor %v is of a generation the feed (at generation %d) has not reached", s.cursor, batch.Generation)
	}
	if len(batch.Records) == 0 {
		if err := s.flush(ctx); err != nil {
			return false, err
		}
		s.endCatchUp()
		w.update(func(st *State) { st.Head = batch.Head; st.Lag = 0; st.Phase = PhaseIdle })
		return true, nil
	}
	s.readOn(ctx, batch)
	return false, s.send(ctx, batch)
}

// read returns the batch after seq after: the one read ahead when it was read
// after that seq, a fresh read otherwise.
func (s *session) read(ctx context.Context, after feed.Seq) (feed.Batch, error) {
	if p := s.dropAhead(); p != nil && p.err == nil && p.after == after {
		s.learn(p.batch, p.limit)
		return p.batch, nil
	}
	limit := s.limit()
	b, err := s.w.readBatch(ctx, after, limit)
	if err == nil {
		s.learn(b, limit)
	}
	return b, err
}

// limit is what the next read may hold: Options.BatchBytes bytes, and
// Options.BatchSize records or fewer (see learn).
func (s *session) limit() feed.BatchLimit {
	if s.records == 0 {
		s.records = s.w.opts.BatchSize
	}
	return feed.BatchLimit{Records: s.records, Bytes: s.w.opts.BatchBytes}
}

// learn sets the record limit of the reads after b, read with limit, from
// how b ended. A batch cut by bytes (More, with fewer records than its
// limit) says the documents are large: the next read asks for a little over
// twice as many records as b held, since a reader may read past the byte
// bound as far as the record limit before it drops the rest (pgfeed's rows
// still cross the wire), and with large documents that costs a batch's worth
// many times over. A batch full by count doubles the limit back, up to
// BatchSize. Only the count changes, never the byte bound nor More, so what
// the worker reads and sends is the same.
func (s *session) learn(b feed.Batch, limit feed.BatchLimit) {
	switch n := len(b.Records); {
	case b.More && n < limit.Records:
		s.records = min(s.w.opts.BatchSize, 2*n+1)
	case b.More:
		s.records = min(s.w.opts.BatchSize, 2*limit.Records)
	}
}

// readOn starts reading the batch after b while b is sent, when records
// follow b (Batch.More: it stopped at a limit); without More the feed is
// caught up, and the next read waits for a wake-up instead.
func (s *session) readOn(ctx context.Context, b feed.Batch) {
	if n := len(b.Records); b.More && n > 0 {
		s.startAhead(ctx, b.Records[n-1].Seq)
	}
}

// startAhead reads the batch after seq after in the background.
func (s *session) startAhead(ctx context.Context, after feed.Seq) {
	p := &readAhead{after: after, limit: s.limit(), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.batch, p.err = s.w.readBatch(ctx, after, p.limit)
	}()
	s.ahead = p
}

// dropAhead waits for the read ahead, if any, and hands it over.
func (s *session) dropAhead() *readAhead {
	p := s.ahead
	if p != nil {
		s.ahead = nil
		<-p.done
	}
	return p
}

// send applies one incremental batch and moves the cursor past it, parking
// what the sink refused and unparking the keys it accepted a newer version of.
func (s *session) send(ctx context.Context, batch feed.Batch) error {
	w := s.w
	w.setPhase(PhaseSending)
	began := w.opts.Clock.Now()
	if err := s.lease.EnsureHeld(ctx); err != nil {
		return err
	}
	var rejs []feed.Rejection
	err := w.call(ctx, "apply", func(ctx context.Context) (err error) {
		rejs, err = w.sink.Apply(ctx, batch.Records)
		return err
	})
	w.update(func(st *State) { st.RecordsSent += int64(len(batch.Records)) })
	if err != nil {
		return err
	}
	refused, err := s.refusals(batch.Records, rejs, "apply")
	if err != nil {
		return err
	}
	var change feed.ParkChange
	for _, r := range batch.Records {
		if p, ok := refused[r.Key]; ok {
			change.Park = append(change.Park, p)
		} else if _, ok := s.parked[r.Key]; ok {
			change.Unpark = append(change.Unpark, r.Key)
		}
	}
	next := feed.Cursor{Generation: batch.Generation, Seq: batch.Records[len(batch.Records)-1].Seq}
	taken := int64(len(batch.Records) - len(change.Park))
	full := batch.More // catching up: more follows at once
	lag := int64(0)
	if full {
		lag = int64(batch.Head - next.Seq)
	}
	if full && len(change.Park) == 0 && len(change.Unpark) == 0 && w.opts.MoveInterval > 0 && w.opts.Clock.Now().Sub(s.movedAt) < w.opts.MoveInterval {
		// Catching up, with nothing to park or unpark, and the cursor moved
		// a moment ago: put this move off (Options.MoveInterval).
		s.applied = next
		s.unmoved += taken
		w.update(func(st *State) { st.Head = batch.Head; st.Lag = lag })
		s.caughtUpTo(ctx, began, taken, lag, full)
		return nil
	}
	if err := s.move(ctx, next, change, taken); err != nil {
		return err
	}
	s.caughtUpTo(ctx, began, taken, lag, full)
	for _, k := range change.Unpark {
		delete(s.parked, k)
	}
	for _, p := range change.Park {
		s.parked[p.Key] = p.Seq
	}
	w.update(func(st *State) { st.Head = batch.Head; st.Lag = lag; st.Parked = len(s.parked) })
	return nil
}

// position is where the sink stands: past the cursor by the batches whose
// move is put off, if any.
func (s *session) position() feed.Cursor {
	if !s.applied.IsZero() {
		return s.applied
	}
	return s.cursor
}

// flush lands the move put off, if one is.
func (s *session) flush(ctx context.Context) error {
	if s.applied.IsZero() {
		return nil
	}
	return s.move(ctx, s.applied, feed.ParkChange{}, 0)
}

// tryFlush lands the move put off, if one is, where failing to is no fault
// of its own: the batches past the cursor are then only sent again.
func (s *session) tryFlush(ctx context.Context) {
	if err := s.flush(ctx); err != nil {
		s.w.log.Debug("the cursor move put off did not land; those batches will be sent again", "error", err)
	}
}

// move makes the fenced cursor move from where the store has it to next,
// past any batches whose move was put off, and records it. taken is the
// number of records the sink took between the batches put off and next, for
// State.RecordsApplied.
func (s *session) move(ctx context.Context, next feed.Cursor, change feed.ParkChange, taken int64) error {
	w := s.w
	err := w.storeCall(ctx, "moving the cursor", func(ctx context.Context) error {
		return w.store.CASCursor(ctx, feed.CursorMove{
			ID:       w.id,
			Holder:   s.lease.Holder(),
			Expected: s.cursor,
			Next:     next,
			Parked:   change,
		})
	})
	if err != nil {
		return err
	}
	applied := s.unmoved + taken
	s.cursor, s.applied, s.unmoved = next, feed.Cursor{}, 0
	now := w.opts.Clock.Now()
	s.movedAt = now
	w.update(func(st *State) { st.Cursor = next; st.LastAdvance = now; st.RecordsApplied += applied })
	return nil
}

// caughtUpTo keeps the account of a catch-up: a full batch begins one (at
// began, when the batch's send began), each batch adds the taken records the
// sink took, and the first batch that is not full ends it.
func (s *session) caughtUpTo(ctx context.Context, began time.Time, taken, lag int64, full bool) {
	if s.prog == nil && full {
		s.prog = &progress{what: "catch-up", began: began, loggedAt: began}
	}
	if s.prog == nil {
		return
	}
	s.prog.rows += taken
	if full {
		s.logProgress(ctx, lag)
	} else {
		s.endCatchUp()
	}
}

// logProgress logs the progress line of the resync or catch-up under way,
// when Options.ProgressInterval has passed since the last; lag is how many
// seqs at most are left.
func (s *session) logProgress(ctx context.Context, lag int64) {
	p, w := s.prog, s.w
	now := w.opts.Clock.Now()
	if now.Sub(p.loggedAt) < w.opts.ProgressInterval {
		return
	}
	p.loggedAt = now
	p.lines++
	took := now.Sub(p.began)
	attrs := []any{"rows", p.rows, "elapsed", took.Round(time.Millisecond), "left_at_most", lag}
	if rate := float64(p.rows) / took.Seconds(); rate > 0 {
		attrs = append(attrs, "rows_per_second", int64(rate), "eta", time.Duration(float64(lag)/rate*float64(time.Second)).Round(time.Second))
	}
	w.log.Log(ctx, slog.LevelInfo, "feed "+p.what+" progress", attrs...)
}

// endCatchUp closes the catch-up under way, if any, with a line when it was
// long enough to log its progress.
func (s *session) endCatchUp() {
	p := s.prog
	if p == nil || p.what != "catch-up" {
		return
	}
	s.prog = nil
	if p.lines == 0 {
		return
	}
	took := s.w.opts.Clock.Now().Sub(p.began)
	s.w.log.Info("feed catch-up done", "rows", p.rows, "took", took.Round(time.Millisecond))
}

// refusals matches the sink's rejections to the records it was sent and makes
// them parked records. A rejection of a key it was not sent, or at another
// seq, is the sink breaking its contract: an error, so nothing is parked on a
// guess.
func (s *session) refusals(records []feed.Record, rejs []feed.Rejection, op string) (map[feed.Key]feed.ParkedRecord, error) {
	if len(rejs) == 0 {
		return nil, nil
	}
	sent := make(map[feed.Key]feed.Seq, len(records))
	for _, r := range records {
		sent[r.Key] = r.Seq
	}
	now := s.w.opts.Clock.Now()
	out := make(map[feed.Key]feed.ParkedRecord, len(rejs))
	for i, rej := range rejs {
		seq, ok := sent[rej.Key]
		if !ok || (rej.Seq != 0 && rej.Seq != seq) {
			return nil, &SinkError{ID: s.w.id, Op: op, Err: fmt.Errorf("rejection %d names key %q at seq %d, which is not a record of the batch", i, rej.Key, rej.Seq)}
		}
		out[rej.Key] = feed.ParkedRecord{Key: rej.Key, Seq: seq, Reason: feed.CleanReason(rej.Reason), ParkedAt: now}
	}
	return out, nil
}

// resync fills a fresh copy of the sink with the feed's current generation and
// publishes it, starting again whenever the generation moves mid-stream.
func (s *session) resync(ctx context.Context) error {
	s.w.setPhase(PhaseResyncing)
	for {
		err := s.resyncOnce(ctx)
		if !errors.Is(err, errGenerationMoved) {
			return err
		}
		s.w.log.Info("feed generation moved during a resync; starting it again")
	}
}

// resyncOnce streams the generation of the first batch it reads into a fresh
// target, in seq order and bounded batches, while writers keep changing the
// feed, publishes it and moves the cursor to (generation, last seq read). The
// package doc ("Why a resync's copy is exact") has the argument.
func (s *session) resyncOnce(ctx context.Context) (err error) {
	w := s.w
	var (
		target    feed.ResyncTarget
		gen       feed.Generation
		published bool
		after     feed.Seq
		refused   = map[feed.Key]feed.ParkedRecord{}
		taken     int64    // records the target took, for State.RecordsApplied
		head      feed.Seq // the head the last read saw, in its batch's snapshot
	)
	now := w.opts.Clock.Now()
	s.prog = &progress{what: "resync", began: now, loggedAt: now}
	defer func() {
		s.prog = nil
		if target != nil && !published {
			s.abort(ctx, target)
		}
	}()
	for {
		batch, err := s.read(ctx, after)
		if err != nil {
			return err
		}
		if target == nil {
			gen = batch.Generation
			switch {
			case s.cursor.Generation == gen:
				return nil // already of this generation: incremental from here
			case s.cursor.Generation > gen:
				return fmt.Errorf("the sink's cursor %v is of a generation the feed (at generation %d) has not reached", s.cursor, gen)
			}
			if err := s.lease.EnsureHeld(ctx); err != nil {
				return err
			}
			err = w.call(ctx, "open resync", func(ctx context.Context) (err error) {
				target, err = w.sink.OpenResync(ctx, gen)
				return err
			})
			if err != nil {
				return err
			}
			if target == nil {
				return &SinkError{ID: w.id, Op: "open resync", Err: errors.New("returned no target and no error")}
			}
		} else if batch.Generation != gen {
			return errGenerationMoved
		}
		if n := len(batch.Records); n > 0 {
			s.readOn(ctx, batch)
			if err := s.lease.EnsureHeld(ctx); err != nil {
				return err
			}
			var rejs []feed.Rejection
			err := w.call(ctx, "apply resync", func(ctx context.Context) (err error) {
				rejs, err = target.Apply(ctx, batch.Records)
				return err
			})
			w.update(func(st *State) { st.RecordsSent += int64(n) })
			if err != nil {
				return err
			}
			r, err := s.refusals(batch.Records, rejs, "apply resync")
			if err != nil {
				return err
			}
			for _, rec := range batch.Records {
				if p, ok := r[rec.Key]; ok {
					refused[rec.Key] = p
				} else {
					delete(refused, rec.Key) // a newer version was taken
				}
			}
			after = batch.Records[n-1].Seq
			taken += int64(n - len(r))
			s.prog.rows += int64(n - len(r))
		}
		head = batch.Head
		lag := int64(batch.Head - after)
		w.update(func(st *State) { st.Head = batch.Head; st.Lag = lag })
		s.logProgress(ctx, lag)
		if !batch.More {
			break // nothing above the last seq read in this batch's snapshot
		}
	}
	if fs, ok := target.(feed.FloorSetter); ok && after == 0 {
		// A copy sent no record (after is still 0: seqs start at 1) has no
		// first batch to take its floor from;
		// head+1 is above every seq handed out so far and below every later
		// one (feed.FloorSetter). A copy that was sent records keeps its
		// first batch's floor.
		if err := s.lease.EnsureHeld(ctx); err != nil {
			return err
		}
		if err := w.call(ctx, "set resync floor", func(ctx context.Context) error {
			return fs.SetFloor(ctx, head+1)
		}); err != nil {
			return err
		}
	}
	if err := s.lease.EnsureHeld(ctx); err != nil {
		return err
	}
	if err := w.call(ctx, "publish", target.Publish); err != nil {
		return err
	}
	published = true
	park := make([]feed.ParkedRecord, 0, len(refused))
	for _, p := range refused {
		park = append(park, p)
	}
	slices.SortFunc(park, func(a, b feed.ParkedRecord) int {
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	if err := s.move(ctx, feed.Cursor{Generation: gen, Seq: after}, feed.ParkChange{Replace: true, Park: park}, taken); err != nil {
		// A rebuild between the last read and the move: the copy just
		// published is of a generation gone, so resync again, under the
		// same lease (the store refused the move and changed nothing).
		var sup *feed.CursorSupersededError
		if errors.As(err, &sup) && sup.Generation > gen {
			return errGenerationMoved
		}
		return err
	}
	s.parked = make(map[feed.Key]feed.Seq, len(park))
	for _, p := range park {
		s.parked[p.Key] = p.Seq
	}
	w.update(func(st *State) { st.Lag = 0; st.Parked = len(park); st.Resyncs++ })
	w.log.Info("feed resync published", "generation", int64(gen), "seq", int64(after), "parked", len(park),
		"rows", taken, "took", w.opts.Clock.Now().Sub(s.prog.began).Round(time.Millisecond))
	return nil
}

// abort throws an unpublished target away, even after ctx ended. It asks no
// EnsureHeld: aborting changes nothing the sink serves, only discards the copy
// this worker opened, and it must run on shutdown when the lease is already
// gone.
func (s *session) abort(ctx context.Context, target feed.ResyncTarget) {
	actx := context.WithoutCancel(ctx)
	if err := s.w.call(actx, "abort resync", target.Abort); err != nil {
		s.w.log.Warn("aborting an unfinished resync target failed", "error", err)
	}
}

// storeCall makes one store call under Options.StoreTimeout, which says why.
// A call cut at the deadline says so, naming what it was doing; any other
// error is returned as it is.
func (w *Worker) storeCall(ctx context.Context, what string, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, w.opts.StoreTimeout)
	defer cancel()
	err := f(cctx)
	if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%s: no answer within %v (syncer.store_timeout): %w", what, w.opts.StoreTimeout, err)
	}
	return err
}

// readBatch reads the batch after seq after under Options.StoreTimeout.
func (w *Worker) readBatch(ctx context.Context, after feed.Seq, limit feed.BatchLimit) (b feed.Batch, err error) {
	err = w.storeCall(ctx, "reading the feed", func(ctx context.Context) (err error) {
		b, err = w.reader.ReadBatch(ctx, w.id.Feed, after, limit)
		return err
	})
	return b, err
}

// sinkTimeoutFor is the deadline of every sink call under lease; see
// Options.SinkTimeout.
func (w *Worker) sinkTimeoutFor(lease feed.Lease) time.Duration {
	set := w.opts.SinkTimeout
	margin, ok := lease.Margin()
	switch {
	case !ok && set > 0:
		return set
	case !ok:
		return DefaultAdvisorySinkTimeout
	case set > 0 && set < margin:
		return set
	}
	if set > 0 {
		w.log.Warn("sink_timeout is not shorter than the lease margin; each sink call is cut at half the margin instead", "sink_timeout", set, "margin", margin)
	}
	return max(margin/2, time.Nanosecond)
}

// call runs one sink call under the sink deadline, turning a panic into an
// error so that a faulty sink cannot take the worker down.
func (w *Worker) call(ctx context.Context, op string, f func(context.Context) error) (err error) {
	cctx, cancel := context.WithTimeout(ctx, w.sinkTimeout)
	defer cancel()
	if o := w.opts.Observer; o != nil {
		began := time.Now()
		defer func() { o.SinkCall(w.id, op, time.Since(began), err) }()
	}
	defer func() {
		if r := recover(); r != nil {
			w.logPanic(ctx, op, r)
			err = &SinkError{ID: w.id, Op: op, Err: fmt.Errorf("panic: %v", r)}
		}
	}()
	if err := f(cctx); err != nil {
		if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("cut at its %v deadline: %w", w.sinkTimeout, err)
		}
		return &SinkError{ID: w.id, Op: op, Err: err}
	}
	return nil
}

// maxPanicSites bounds the panic sites a worker remembers; a panic at a site
// past them is logged with its count only, as if seen before.
const maxPanicSites = 64

// logPanic logs the sink's panic r; call it from the deferred function that
// recovered it. The first panic at a site (the function and line that
// panicked, past the runtime's own frames) is logged with its stack; a later
// one there, with how many times it happened, in one line.
func (w *Worker) logPanic(ctx context.Context, op string, r any) {
	site := panicSite()
	if w.panicSites == nil {
		w.panicSites = make(map[string]int)
	}
	n, seen := w.panicSites[site]
	switch {
	case !seen && len(w.panicSites) >= maxPanicSites:
		w.log.Log(ctx, slog.LevelError, "sink panicked; too many places panicked to log each one's stack", "op", op, "panic", fmt.Sprint(r), "site", site)
	case !seen:
		w.panicSites[site] = 1
		w.log.Log(ctx, slog.LevelError, "sink panicked", "op", op, "panic", fmt.Sprint(r), "site", site, "stack", string(debug.Stack()))
	default:
		w.panicSites[site] = n + 1
		w.log.Log(ctx, slog.LevelError, "sink panicked again where it panicked before; its stack was logged then", "op", op, "panic", fmt.Sprint(r), "site", site, "count", n+1)
	}
}

// panicSite names the place a panic being recovered came from: the first
// frame past runtime.gopanic that is not the runtime's (a nil map write
// panics inside the runtime, on behalf of the code that wrote). It must run
// inside the deferred function that recovers, where that frame is still on
// the stack.
func panicSite() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	past := false
	for {
		f, more := frames.Next()
		if past && !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s:%d", f.Function, f.Line)
		}
		past = past || f.Function == "runtime.gopanic"
		if !more {
			return "unknown"
		}
	}
}

// wait blocks until a wake-up, the poll interval, or the end of ctx.
func (s *session) wait(ctx context.Context) {
	t := s.w.opts.Clock.NewTimer(s.w.opts.PollInterval)
	defer t.Stop()
	var woken <-chan struct{} // nil, never ready, without a subscription
	if s.sub != nil {
		woken = s.sub.C()
	}
	select {
	case <-woken:
	case <-t.C():
	case <-ctx.Done():
	}
}

// fault records err as the worker's last error and logs it. A store that calls
// the worker's input invalid is a bug in one of the two, not a passing fault,
// so it is logged as an error.
func (w *Worker) fault(ctx context.Context, err error) {
	now := w.opts.Clock.Now()
	w.update(func(st *State) { st.LastError, st.LastErrorAt, st.RecoveredAt = err, now, time.Time{} })
	level := slog.LevelWarn
	if errors.Is(err, feed.ErrInvalid) {
		level = slog.LevelError
	}
	w.log.Log(ctx, level, "feed sync fault", "error", err)
}

// recovered marks the last fault recovered from, and logs it, the first time
// the worker gets something done after it; see State.RecoveredAt.
func (w *Worker) recovered(ctx context.Context) {
	now := w.opts.Clock.Now()
	var last error
	var at time.Time
	w.update(func(st *State) {
		if st.LastError != nil && st.RecoveredAt.IsZero() {
			st.RecoveredAt, last, at = now, st.LastError, st.LastErrorAt
		}
	})
	if last != nil {
		w.log.Log(ctx, slog.LevelInfo, "feed sync recovered", "last_error", last, "last_error_at", at)
	}
}

// backoff waits after the failures-th fault in a row: BackoffMin doubled per
// fault, capped at BackoffMax, jittered to between half and all of it so that
// workers hit by one outage do not retry in step; and never less than floor,
// the wait the fault itself asked for (feed.RetryDelay), which BackoffMax
// does not cap: the server knows best when it will take more.
func (w *Worker) backoff(ctx context.Context, failures int, floor time.Duration) {
	w.setPhase(PhaseBackoff)
	d := w.opts.BackoffMin
	for i := 1; i < failures && d < w.opts.BackoffMax; i++ {
		d *= 2
	}
	w.sleep(ctx, max(jitter(min(d, w.opts.BackoffMax), 0.5, 1), floor))
}

// sleep waits d on the clock, or until ctx ends.
func (w *Worker) sleep(ctx context.Context, d time.Duration) {
	t := w.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// jitter returns a random duration in [lo·d, hi·d).
func jitter(d time.Duration, lo, hi float64) time.Duration {
	return time.Duration(float64(d) * (lo + rand.Float64()*(hi-lo)))
}
