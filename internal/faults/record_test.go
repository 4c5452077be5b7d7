package faults_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// recorder is the recording layer of I2 and I4: it wraps the sink of every
// worker of a test, logs each call that reached the target (process, op,
// first and last seq, when it started and ended, its error), and after each
// call to the live copy asks the target itself, through the probe, which seq
// each of the call's keys now holds. A key whose seq is ever lower than one
// seen before went back (I2), whoever sent it; the probe runs under the
// recorder's lock, so its readings are in real time order.
type recorder struct {
	probe func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error)

	mu      sync.Mutex
	calls   []callRec
	seen    map[feed.Key]feed.Seq
	regress []string
	// before, when set, runs before each call is passed on, on the worker's
	// goroutine, just after the worker's EnsureHeld: a test's pause. It
	// returns the context the call then runs under (a paused process's call
	// runs with the deadline it would have had on waking, not an expired one).
	before func(ctx context.Context, proc, op string, recs []feed.Record) context.Context
}

type callRec struct {
	proc        string
	op          string
	first, last feed.Seq
	n           int
	seqs        []feed.Seq
	start, end  time.Time
	err         error
}

func newRecorder(probe func(context.Context, []feed.Key) (map[feed.Key]feed.Seq, error)) *recorder {
	return &recorder{probe: probe, seen: map[feed.Key]feed.Seq{}}
}

func (r *recorder) setBefore(f func(ctx context.Context, proc, op string, recs []feed.Record) context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.before = f
}

// wrap is s as process proc's sink.
func (r *recorder) wrap(proc string, s feed.Sink) feed.Sink { return &recSink{r: r, proc: proc, s: s} }

func (r *recorder) call(ctx context.Context, proc, op string, recs []feed.Record, f func(context.Context) ([]feed.Rejection, error)) ([]feed.Rejection, error) {
	c := callRec{proc: proc, op: op, n: len(recs), start: time.Now()}
	r.mu.Lock()
	before := r.before
	r.mu.Unlock()
	if before != nil {
		ctx = before(ctx, proc, op, recs)
	}
	if len(recs) > 0 {
		c.first, c.last = recs[0].Seq, recs[len(recs)-1].Seq
		c.seqs = make([]feed.Seq, len(recs))
		for i, rec := range recs {
			c.seqs[i] = rec.Seq
		}
	}
	rejs, err := f(ctx)
	c.end, c.err = time.Now(), err
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	if op == "apply" && r.probe != nil && len(recs) > 0 {
		keys := make([]feed.Key, len(recs))
		for i, rec := range recs {
			keys[i] = rec.Key
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		got, perr := r.probe(pctx, keys)
		cancel()
		if perr == nil {
			r.note(proc, got)
		}
	}
	return rejs, err
}

// note records probed seqs; r.mu is held.
func (r *recorder) note(proc string, got map[feed.Key]feed.Seq) {
	for k, s := range got {
		if s < r.seen[k] {
			r.regress = append(r.regress, fmt.Sprintf("%s went back from seq %d to %d (seen after a call of %s)", k, r.seen[k], s, proc))
			continue
		}
		r.seen[k] = s
	}
}

// checkNoRegress fails t when a key ever went back (I2) in sink.
func (r *recorder) checkNoRegress(t testing.TB, sink feed.SinkName) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.regress) > 0 {
		n := len(r.regress)
		show := r.regress
		if n > 10 {
			show = show[:10]
		}
		t.Errorf("I2: %d keys went back in %s:\n  %s", n, sink, strings.Join(show, "\n  "))
	}
	if r.probe != nil && len(r.seen) == 0 && len(r.calls) > 0 {
		t.Errorf("I2: the probe of %s never read a key: the check saw nothing", sink)
	}
}

// callsOf is a copy of the calls, in the order they ended.
func (r *recorder) snapshot() []callRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs := append([]callRec(nil), r.calls...)
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].end.Before(cs[j].end) })
	return cs
}

type recSink struct {
	r    *recorder
	proc string
	s    feed.Sink
}

func (s *recSink) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	return s.r.call(ctx, s.proc, "apply", recs, func(ctx context.Context) ([]feed.Rejection, error) { return s.s.Apply(ctx, recs) })
}

func (s *recSink) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	var t feed.ResyncTarget
	_, err := s.r.call(ctx, s.proc, "open resync", nil, func(ctx context.Context) ([]feed.Rejection, error) {
		var err error
		t, err = s.s.OpenResync(ctx, g)
		return nil, err
	})
	if err != nil {
		return nil, err
	}
	return &recTarget{s: s, t: t}, nil
}

type recTarget struct {
	s *recSink
	t feed.ResyncTarget
}

func (t *recTarget) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	return t.s.r.call(ctx, t.s.proc, "apply resync", recs, func(ctx context.Context) ([]feed.Rejection, error) { return t.t.Apply(ctx, recs) })
}

func (t *recTarget) Publish(ctx context.Context) error {
	_, err := t.s.r.call(ctx, t.s.proc, "publish", nil, func(ctx context.Context) ([]feed.Rejection, error) { return nil, t.t.Publish(ctx) })
	return err
}

func (t *recTarget) Abort(ctx context.Context) error {
	_, err := t.s.r.call(ctx, t.s.proc, "abort resync", nil, func(ctx context.Context) ([]feed.Rejection, error) { return nil, t.t.Abort(ctx) })
	return err
}
