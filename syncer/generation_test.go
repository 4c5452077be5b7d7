package syncer_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// TestResyncGenerationMovesBeforeItsMove rebuilds the feed while a resync
// publishes, after its last read: the store refuses the resync's move of the
// generation gone (a *feed.CursorSupersededError naming the new one), and the
// worker resyncs again at once under the same lease, without counting a fault,
// and ends with the new generation published and its cursor there.
func TestResyncGenerationMovesBeforeItsMove(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		for i := range 150 {
			e.write(feed.Put(key(i), doc(`{"g":1}`)))
		}
		w := newWorld(e, "search")
		var once atomic.Bool
		var holder atomic.Value
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "publish" && c.Gen == 1 && once.CompareAndSwap(false, true) {
				holder.Store(c.Holder)
				e.rebuild()
				for i := range 30 {
					e.write(feed.Put(key(9000+i), doc(`{"g":2}`)))
				}
			}
			return nil
		})
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		if g, c := w.generation(), e.cursor(w.id); g != 2 || c.Generation != 2 {
			t.Fatalf("published generation %d, cursor %v; want generation 2 for both", g, c)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink after the rebuild at publish", w.docs(), want)
		var ops []string
		for _, c := range w.log() {
			ops = append(ops, fmt.Sprintf("%s/g%d", c.Op, c.Gen))
		}
		if i := slices.Index(ops, "publish/g1"); i < 0 || !slices.Contains(ops[i:], "open/g2") || !slices.Contains(ops[i:], "publish/g2") {
			t.Fatalf("calls %v: want generation 1 published, then generation 2 opened and published", ops)
		}
		st := run.r.States()[0]
		if h, _ := holder.Load().(feed.LeaseHolder); st.Holder != h || h == "" {
			t.Fatalf("the worker holds lease %q, published generation 1 under %q: the refused move should not cost the lease", st.Holder, h)
		}
		if st.LastError != nil {
			t.Fatalf("the worker recorded a fault (%v); a rebuild at publish is no fault", st.LastError)
		}
		noProblems(t, w)
	})
}

// TestIncrementalMoveLosesToRebuild rebuilds the feed while an incremental
// batch is in the sink, after its read: the store refuses the batch's move of
// the generation gone, and the worker, taking the lease again, resyncs into
// the new generation.
func TestIncrementalMoveLosesToRebuild(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		e.write(feed.Put("a", doc(`{"g":1}`)))
		w := newWorld(e, "search")
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		var once atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "apply" && once.CompareAndSwap(false, true) {
				e.rebuild()
				e.write(feed.Put("b", doc(`{"g":2}`)))
			}
			return nil
		})
		e.write(feed.Put("a", doc(`{"g":1,"v":2}`)))
		e.waitCaughtUp(w.id)
		if g, c := w.generation(), e.cursor(w.id); g != 2 || c.Generation != 2 {
			t.Fatalf("published generation %d, cursor %v; want generation 2 for both", g, c)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink after the rebuild under an incremental batch", w.docs(), want)
		e.eventually("a second resync counted", e.limit(), func() bool { return run.r.States()[0].Resyncs == 2 })
		noProblems(t, w)
	})
}
