package read_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/read"
)

// source is an in-memory event source, optionally failing its next reads,
// or running a function once, in its next read.
type source struct {
	mu     sync.Mutex
	events []read.Event
	fail   int
	reads  int
	onRead func()
}

func (s *source) add(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		p := read.Position(len(s.events) + 1)
		s.events = append(s.events, read.Event{Position: p, Stream: "s", Version: int64(p), Type: "E", Data: json.RawMessage(`{}`)})
	}
}

func (s *source) ReadAll(_ context.Context, after read.Position, limit int) ([]read.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if f := s.onRead; f != nil {
		s.onRead = nil
		f()
	}
	if s.fail > 0 {
		s.fail--
		return nil, errors.New("source down")
	}
	var out []read.Event
	for _, e := range s.events {
		if e.Position > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *source) readCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// view records what apply saw, batch by batch.
type view struct {
	mu      sync.Mutex
	applied []read.Position
	batches []int
}

func (v *view) apply(_ context.Context, _ read.NoTx, events []read.Event) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.batches = append(v.batches, len(events))
	for _, e := range events {
		v.applied = append(v.applied, e.Position)
	}
	return nil
}

func (v *view) positions() []read.Position {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.applied)
}

func upTo(n int) []read.Position {
	out := make([]read.Position, n)
	for i := range out {
		out[i] = read.Position(i + 1)
	}
	return out
}

var key = read.CheckpointKey{Projection: "p"}

// bounded is t's context, ended after 10 s: a runner that can no longer
// commit (CatchUp retries a lost guard at once) fails the test instead of
// spinning to the package timeout.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRunnerStopAndResume(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	src, store, v := &source{}, read.NewMemoryStore(), &view{}
	src.add(10)
	r1, err := read.NewRunner(src, store, key, v.apply, read.RunnerOptions{Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if n, err := r1.Step(ctx); err != nil || n != 3 {
			t.Fatalf("Step = %d, %v", n, err)
		}
	}
	// r1 stops here; a new runner (a restarted process) resumes from the
	// checkpoint, and every event is applied exactly once, in order.
	r2, err := read.NewRunner(src, store, key, v.apply, read.RunnerOptions{Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r2.CatchUp(ctx); err != nil || n != 4 {
		t.Fatalf("CatchUp = %d, %v; want the 4 events left", n, err)
	}
	if got := v.positions(); !slices.Equal(got, upTo(10)) {
		t.Fatalf("applied %v", got)
	}
	if !slices.Equal(v.batches, []int{3, 3, 3, 1}) {
		t.Fatalf("batches %v, want 3,3,3,1", v.batches)
	}
	if at, _ := store.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: 10}) {
		t.Fatalf("checkpoint %v, want position 10", at)
	}
	// After a reset the runner replays from the origin.
	if err := store.ResetCheckpoint(ctx, key); err != nil {
		t.Fatal(err)
	}
	if n, err := r2.CatchUp(ctx); err != nil || n != 10 {
		t.Fatalf("replay = %d, %v", n, err)
	}
}

// A reset between a batch's read of the checkpoint and its commit makes
// the batch lose: here the first batch of a replay, read from the origin of
// epoch 1, commits after a second reset. It applies nothing, and the runner
// replays from the origin of epoch 2.
func TestRunnerBatchAcrossReset(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	src, store, v := &source{}, read.NewMemoryStore(), &view{}
	src.add(4)
	r, err := read.NewRunner(src, store, key, v.apply, read.RunnerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.CatchUp(ctx); err != nil || n != 4 {
		t.Fatalf("CatchUp = %d, %v", n, err)
	}
	if err := store.ResetCheckpoint(ctx, key); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.onRead = func() {
		if err := store.ResetCheckpoint(ctx, key); err != nil {
			t.Error(err)
		}
	}
	src.mu.Unlock()
	n, err := r.Step(ctx)
	var sup *read.CheckpointSupersededError
	if !errors.As(err, &sup) || n != 0 || sup.Expected != (read.Checkpoint{Epoch: 1}) || sup.Actual != (read.Checkpoint{Epoch: 2}) {
		t.Fatalf("Step across a reset = %d, %v; want superseded at the origin of epoch 2", n, err)
	}
	if got := v.positions(); !slices.Equal(got, upTo(4)) {
		t.Fatalf("the lost batch was applied: %v", got)
	}
	if n, err := r.CatchUp(ctx); err != nil || n != 4 {
		t.Fatalf("replay = %d, %v", n, err)
	}
	if got := v.positions(); !slices.Equal(got, append(upTo(4), upTo(4)...)) {
		t.Fatalf("applied %v, want 1..4 and the replay 1..4", got)
	}
	if at, _ := store.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: 4, Epoch: 2}) {
		t.Fatalf("checkpoint %v, want position 4 of epoch 2", at)
	}
	// CatchUp retries a lost batch at once, and replays to the end.
	if err := store.ResetCheckpoint(ctx, key); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.onRead = func() {
		if err := store.ResetCheckpoint(ctx, key); err != nil {
			t.Error(err)
		}
	}
	src.mu.Unlock()
	if n, err := r.CatchUp(ctx); err != nil || n != 4 {
		t.Fatalf("CatchUp whose first batch lost = %d, %v; want the 4 events replayed", n, err)
	}
	if at, _ := store.ReadCheckpoint(ctx, key); at != (read.Checkpoint{Position: 4, Epoch: 4}) {
		t.Fatalf("checkpoint %v, want position 4 of epoch 4", at)
	}
}

func TestRunnersRacing(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	src, store, v := &source{}, read.NewMemoryStore(), &view{}
	src.add(200)
	var wg sync.WaitGroup
	for range 4 {
		r, err := read.NewRunner(src, store, key, v.apply, read.RunnerOptions{Batch: 7})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if _, err := r.CatchUp(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := v.positions(); !slices.Equal(got, upTo(200)) {
		t.Fatalf("four runners applied %d events (%v...), want each of 200 exactly once in order", len(got), got[:min(len(got), 10)])
	}
}

// Run polls on its clock, backs off after failures (doubling from Poll), and
// returns when its context ends.
func TestRunnerRun(t *testing.T) {
	t.Parallel()
	clock := feedtest.NewManualClock(time.Unix(0, 0))
	src, store, v := &source{fail: 2}, read.NewMemoryStore(), &view{}
	src.add(5)
	r, err := read.NewRunner(src, store, key, v.apply, read.RunnerOptions{Poll: time.Second, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitTimer := func() {
		t.Helper()
		wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer wcancel()
		if err := clock.WaitForTimers(wctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	waitTimer() // first read failed; waiting Poll
	if src.readCount() != 1 {
		t.Fatalf("%d reads before the first wait", src.readCount())
	}
	clock.Advance(time.Second)
	waitTimer() // second read failed; waiting 2×Poll
	if src.readCount() != 2 {
		t.Fatalf("%d reads after one backoff", src.readCount())
	}
	clock.Advance(time.Second)
	waitTimer()
	if src.readCount() != 2 || len(v.positions()) != 0 {
		t.Fatal("the runner retried before its doubled backoff elapsed")
	}
	clock.Advance(time.Second)
	waitTimer() // caught up; polling
	if got := v.positions(); !slices.Equal(got, upTo(5)) {
		t.Fatalf("applied %v after recovering", got)
	}
	src.add(3)
	clock.Advance(time.Second)
	waitTimer()
	if got := v.positions(); !slices.Equal(got, upTo(8)) {
		t.Fatalf("applied %v after a poll", got)
	}
	// A recovery starts the backoff over: the next failure waits Poll again.
	src.mu.Lock()
	src.fail = 1
	src.mu.Unlock()
	reads := src.readCount()
	clock.Advance(time.Second)
	waitTimer() // the poll's read failed; waiting Poll, not 4×Poll
	clock.Advance(time.Second)
	waitTimer()
	if got := src.readCount(); got != reads+2 {
		t.Fatalf("%d reads a Poll after a failure that followed a recovery, want %d: the backoff did not start over", got, reads+2)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
}

// An apply that fails leaves the checkpoint where it was, and Step returns
// the failure as it is.
func TestRunnerApplyFails(t *testing.T) {
	t.Parallel()
	src, store := &source{}, read.NewMemoryStore()
	src.add(3)
	boom := errors.New("poison")
	r, err := read.NewRunner(src, store, key, func(context.Context, read.NoTx, []read.Event) error { return boom }, read.RunnerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CatchUp(bounded(t)); !errors.Is(err, boom) {
		t.Fatalf("CatchUp = %v", err)
	}
	if at, _ := store.ReadCheckpoint(t.Context(), key); at != (read.Checkpoint{}) {
		t.Fatalf("checkpoint moved to %v", at)
	}
}

func TestRunnerOptionsRefused(t *testing.T) {
	t.Parallel()
	src, store := &source{}, read.NewMemoryStore()
	apply := func(context.Context, read.NoTx, []read.Event) error { return nil }
	for _, tc := range []struct {
		name  string
		build func() error
		field string
	}{
		{"nil source", func() error { _, err := read.NewRunner(nil, store, key, apply, read.RunnerOptions{}); return err }, "runner.source"},
		{"nil store", func() error {
			_, err := read.NewRunner[read.NoTx](src, nil, key, apply, read.RunnerOptions{})
			return err
		}, "runner.store"},
		{"nil apply", func() error { _, err := read.NewRunner(src, store, key, nil, read.RunnerOptions{}); return err }, "runner.apply"},
		{"bad key", func() error {
			_, err := read.NewRunner(src, store, read.CheckpointKey{}, apply, read.RunnerOptions{})
			return err
		}, "checkpoint.projection"},
		{"negative batch", func() error {
			_, err := read.NewRunner(src, store, key, apply, read.RunnerOptions{Batch: -1})
			return err
		}, "runner.batch"},
		{"huge batch", func() error {
			_, err := read.NewRunner(src, store, key, apply, read.RunnerOptions{Batch: feed.MaxBatchLimit + 1})
			return err
		}, "runner.batch"},
		{"negative poll", func() error {
			_, err := read.NewRunner(src, store, key, apply, read.RunnerOptions{Poll: -time.Second})
			return err
		}, "runner.poll"},
		{"backoff below poll", func() error {
			_, err := read.NewRunner(src, store, key, apply, read.RunnerOptions{Poll: time.Minute, BackoffMax: time.Second})
			return err
		}, "runner.backoff_max"},
	} {
		var inv *feed.InvalidError
		if err := tc.build(); !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: err = %v, want an InvalidError naming %s", tc.name, err, tc.field)
		}
	}
}

// resettingSource resets the checkpoint during every read, as a reset loop
// would: each batch CatchUp reads loses its compare-and-set.
type resettingSource struct {
	*source
	store *read.MemoryStore
	t     *testing.T
}

func (s resettingSource) ReadAll(ctx context.Context, after read.Position, limit int) ([]read.Event, error) {
	if err := s.store.ResetCheckpoint(ctx, key); err != nil {
		s.t.Error(err)
	}
	return s.source.ReadAll(ctx, after, limit)
}

// CatchUp gives up after MaxResetsInARow batches in a row lost to resets,
// returning the loss so Run backs off instead of spinning; losses to a rival
// that moved the checkpoint forward never count (TestRunnersRacing).
func TestCatchUpBoundsResetLoop(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	src, store, v := &source{}, read.NewMemoryStore(), &view{}
	src.add(3)
	r, err := read.NewRunner(resettingSource{src, store, t}, store, key, v.apply, read.RunnerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.CatchUp(ctx)
	var sup *read.CheckpointSupersededError
	if !errors.As(err, &sup) || n != 0 {
		t.Fatalf("CatchUp under a reset loop = %d, %v; want a superseded error", n, err)
	}
	if got := src.readCount(); got != read.MaxResetsInARow {
		t.Fatalf("CatchUp read %d batches before giving up, want %d", got, read.MaxResetsInARow)
	}
	if got := v.positions(); len(got) != 0 {
		t.Fatalf("lost batches were applied: %v", got)
	}
}

// aheadSource lets a rival commit one event during each of CatchUp's reads,
// so every batch CatchUp reads loses to a checkpoint moved forward.
type aheadSource struct {
	*source
	store *read.MemoryStore
	rival *view
	t     *testing.T
}

func (s aheadSource) ReadAll(ctx context.Context, after read.Position, limit int) ([]read.Event, error) {
	at, err := s.store.ReadCheckpoint(ctx, key)
	if err != nil {
		s.t.Error(err)
	}
	if events, _ := s.source.ReadAll(ctx, at.Position, 1); len(events) == 1 {
		if err := s.store.Commit(ctx, key, at, events[0].Position, func(ctx context.Context, tx read.NoTx) error {
			return s.rival.apply(ctx, tx, events)
		}); err != nil {
			s.t.Error(err)
		}
	}
	return s.source.ReadAll(ctx, after, limit)
}

// Losses to a rival that moves the checkpoint forward are progress: CatchUp
// retries them at once however many there are in a row, and returns once
// the projection is caught up.
func TestCatchUpRetriesRivalProgress(t *testing.T) {
	t.Parallel()
	ctx := bounded(t)
	src, store, v, rival := &source{}, read.NewMemoryStore(), &view{}, &view{}
	src.add(3 * read.MaxResetsInARow)
	r, err := read.NewRunner(aheadSource{src, store, rival, t}, store, key, v.apply, read.RunnerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.CatchUp(ctx)
	if err != nil || n != 0 {
		t.Fatalf("CatchUp behind a rival = %d, %v; want 0 applied, no error", n, err)
	}
	if got := rival.positions(); !slices.Equal(got, upTo(3*read.MaxResetsInARow)) {
		t.Fatalf("the rival applied %v, want every event once", got)
	}
}
