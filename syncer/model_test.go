package syncer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// TestRandomHistories drives the driver through random histories on memfeed,
// in fake time: writes and deletes, rebuilds, a sink that refuses some keys
// and fails for a while, operator retries, leases taken away mid-call, and
// runners stopped and started. Along the way only the live lease holder calls
// the sink, but for at most one call in flight per lease taken away, and no
// key goes back to an older version; at the end, with
// the writers stopped, the sink holds exactly the feed's live documents except
// the keys parked for it, and every parked record names a key the sink refused
// at that key's current version.
func TestRandomHistories(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		rapid.Check(bubbleTB{t}, func(rt *rapid.T) {
			e := newEnv(t, memBackend)
			e.t = t
			w := newWorld(e, "model")
			var refuse [3]atomic.Bool // refuse key m<i> while set
			w.setReject(func(r feed.Record) string {
				var i int
				if _, err := fmt.Sscanf(string(r.Key), "m%d", &i); err == nil && i < len(refuse) && refuse[i].Load() {
					return fmt.Sprintf("m%d refused", i)
				}
				return ""
			})
			var failures atomic.Int32
			w.setHook(func(ctx context.Context, c *call) error {
				if c.Op != "abort" && failures.Add(-1) >= 0 {
					return fmt.Errorf("injected outage")
				}
				return nil
			})
			opts := testOptions(t, e)
			opts.BatchSize = rapid.IntRange(1, 12).Draw(rt, "batch")
			opts.Logger = slog.New(slog.DiscardHandler)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var run *running
			var spy *leaseSpy
			stolen := map[feed.LeaseHolder]bool{}
			startRunner := func() {
				spy = newSpy(e.h.Store)
				r, err := syncer.NewRunner(split{e.h.Reader, spy}, []syncer.Target{{ID: w.id, Sink: w.sinkFor("W", spy)}}, opts)
				if err != nil {
					rt.Fatal(err)
				}
				rctx, rcancel := context.WithCancel(ctx)
				run = &running{r: r, cancel: rcancel, done: make(chan struct{})}
				go func() { defer close(run.done); _ = r.Run(rctx) }()
			}
			startRunner()
			defer func() { run.stop() }()
			key := func() feed.Key { return feed.Key(fmt.Sprintf("m%d", rapid.IntRange(0, 4).Draw(rt, "key"))) }

			// settle lets the worker, most of the time, see each change on its
			// own before the next: it waits until every goroutine of the
			// bubble is blocked.
			settle := func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "settle") > 0 {
					synctest.Wait()
				}
			}
			write := func(rt *rapid.T) {
				n := rapid.IntRange(1, 6).Draw(rt, "n")
				var changes []feed.Change
				for range n {
					if rapid.IntRange(0, 4).Draw(rt, "op") == 0 {
						changes = append(changes, feed.Delete(key()))
					} else {
						changes = append(changes, feed.Put(key(), doc(`{"v":%d}`, rapid.IntRange(0, 1000).Draw(rt, "v"))))
					}
				}
				e.write(changes...)
				settle(rt)
			}

			rt.Repeat(map[string]func(*rapid.T){
				"write":      write,
				"write more": write, // writes twice as often as anything else
				"rebuild":    func(rt *rapid.T) { e.rebuild() },
				"refuse": func(rt *rapid.T) {
					r := &refuse[rapid.IntRange(0, len(refuse)-1).Draw(rt, "i")]
					r.Store(!r.Load())
					settle(rt)
				},
				"retry": func(rt *rapid.T) {
					if _, err := e.h.Store.RetryParked(e.ctx, w.id, key()); err != nil {
						rt.Fatal(err)
					}
				},
				"outage": func(rt *rapid.T) { failures.Store(int32(rapid.IntRange(1, 4).Draw(rt, "calls"))) },
				"wait": func(rt *rapid.T) {
					time.Sleep(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "ms")) * time.Millisecond)
				},
				"steal": func(rt *rapid.T) {
					l := spy.lease(w.id)
					if l == nil {
						return
					}
					stolen[l.Holder()] = true
					_ = l.Release(e.ctx)
					rctx, rcancel := context.WithCancel(e.ctx)
					defer rcancel()
					rival, err := e.h.Store.AcquireLease(rctx, w.id)
					if err != nil {
						return // the worker took it back first
					}
					time.Sleep(time.Duration(rapid.IntRange(0, 10_000).Draw(rt, "held ms")) * time.Millisecond)
					_ = rival.Release(e.ctx)
				},
				"restart": func(rt *rapid.T) {
					run.stop()
					startRunner()
				},
				"": func(rt *rapid.T) {
					if p := w.problems(); len(p) > 0 {
						rt.Fatalf("regression: %v", p[0])
					}
					// A lease taken away between the worker's EnsureHeld and
					// its call leaves that one call in flight; never more.
					stale := map[feed.LeaseHolder]int{}
					for _, c := range w.log() {
						if c.Op == "abort" || c.HeldInStore {
							continue
						}
						stale[c.Holder]++
						if !stolen[c.Holder] || stale[c.Holder] > 1 {
							rt.Fatalf("%s call by holder %q while the store did not name it the live holder (stolen %v, stale calls %d)", c.Op, c.Holder, stolen[c.Holder], stale[c.Holder])
						}
					}
				},
			})

			failures.Store(0)
			e.eventually("caught up", e.limit(), func() bool { return e.caughtUp(w.id) })
			want, _ := e.liveDocs()
			got := w.docs()
			parked := map[feed.Key]feed.Seq{}
			for _, p := range e.parked(w.id) {
				parked[p.Key] = p.Seq
			}
			b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
			if err != nil {
				rt.Fatal(err)
			}
			current := map[feed.Key]feed.Seq{}
			for _, r := range b.Records {
				current[r.Key] = r.Seq
			}
			for k, seq := range parked {
				if current[k] != seq {
					rt.Fatalf("%q parked at seq %d, but its row is at %d: an accepted newer version should have unparked it", k, seq, current[k])
				}
				delete(want, k)
				delete(got, k)
			}
			if g := w.generation(); g != b.Generation {
				rt.Fatalf("sink published generation %d, feed at %d", g, b.Generation)
			}
			for k, v := range want {
				if string(got[k]) != string(v) {
					rt.Fatalf("%q is %s in the sink, %s in the feed (parked %v)", k, got[k], v, parked)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					rt.Fatalf("%q is in the sink but not live in the feed", k)
				}
			}
		})
	})
}

// bubbleTB hides *testing.T from rapid, which asks it for its deadline, a
// question a synctest bubble refuses.
type bubbleTB struct{ *testing.T }
