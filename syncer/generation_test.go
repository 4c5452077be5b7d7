package syncer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestRebuildDropsUnsealed: in the concurrent mode, no row of a generation
// reaches a sink of a later one, whether it waited unsealed at the rebuild
// or raced it.
//
// First, deterministically: with no runner (and so no sealer) running,
// writes wait unsealed, including a newer version of a key the sink holds;
// the feed is rebuilt; a runner then starts, seals and syncs. None of the
// unsealed writes may reach the sink at all, since none was ever sealed.
// Then, with the runner and its sealer running, writers race a second
// rebuild, each write learning its generation from its result: once the
// worker opened the new generation's copy, every record it sends must be
// of a write that landed in that generation, and the sink ends equal to
// the feed, every write of the new generation in it.
func TestRebuildDropsUnsealed(t *testing.T) {
	forEachConcurrentBackend(t, func(t *testing.T, e *env) {
		e.write(feed.Put("a", doc(`{"id":-1}`)), feed.Put("b", doc(`{"id":-1}`)))
		w := newWorld(e, "search")
		var mu sync.Mutex
		var leaks []string
		watchGen := feed.Generation(0) // records after its copy opened must be of it
		var sent []json.RawMessage     // the documents sent since then; nil before
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "open" {
				mu.Lock()
				if c.Gen == watchGen {
					sent = []json.RawMessage{}
				}
				mu.Unlock()
			}
			return nil
		})
		w.setReject(func(r feed.Record) string {
			mu.Lock()
			defer mu.Unlock()
			if bytes.Contains(r.Doc, []byte("old")) {
				leaks = append(leaks, fmt.Sprintf("%s = %s at seq %d", r.Key, r.Doc, r.Seq))
			}
			if watchGen != 0 && sent != nil {
				sent = append(sent, bytes.Clone(r.Doc))
			}
			return ""
		})
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		run.stop()

		var unsealed []feed.Change
		for i := range 10 {
			unsealed = append(unsealed, feed.Put(feed.Key(fmt.Sprintf("old%d", i)), doc(`{"old":%d}`, i)))
		}
		unsealed = append(unsealed, feed.Put("a", doc(`{"old":"a"}`)), feed.Delete("b"))
		if _, err := e.h.Write(e.ctx, e.feed, unsealed); err != nil {
			t.Fatalf("write: %v", err)
		}
		if d, err := e.h.Store.Describe(e.ctx, e.feed); err != nil || d.Unsealed != 12 {
			t.Fatalf("before the rebuild: %+v, %v; want 12 keys unsealed", d, err)
		}
		if g := e.rebuild(); g != 2 {
			t.Fatalf("rebuilt to generation %d, want 2", g)
		}
		if _, err := e.h.Write(e.ctx, e.feed, []feed.Change{feed.Put("n", doc(`{"id":-2}`))}); err != nil {
			t.Fatalf("write: %v", err)
		}
		one(t, e, w, "B", testOptions(t, e))
		e.waitCaughtUp(w.id)
		mu.Lock()
		leaked := slices.Clone(leaks)
		mu.Unlock()
		if len(leaked) > 0 {
			t.Fatalf("writes unsealed at the rebuild reached the sink: %v", leaked)
		}
		want, _ := e.liveDocs()
		if len(want) != 1 || want["n"] == nil {
			t.Fatalf("the feed after the rebuild holds %v; want only n", slices.Sorted(maps.Keys(want)))
		}
		sameDocs(t, "sink after the rebuild", w.docs(), want)
		if g := w.generation(); g != 2 {
			t.Fatalf("published generation %d, want 2", g)
		}

		// The race: writers against a rebuild, the sealer running.
		mu.Lock()
		watchGen, sent = 3, nil
		mu.Unlock()
		const writers, each = 4, 20
		gens := make([]feed.Generation, writers*each) // write i is key r<i>, by writer i%writers
		var wrote atomic.Int32
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for i := w; i < len(gens); i += writers {
					res, err := e.h.Write(context.WithoutCancel(e.ctx), e.feed, []feed.Change{feed.Put(feed.Key(fmt.Sprintf("r%d", i)), doc(`{"id":%d}`, i))})
					if err != nil {
						t.Errorf("write r%d: %v", i, err)
						return
					}
					gens[i] = res.Generation
					wrote.Add(1)
					time.Sleep(time.Millisecond) // spread over the rebuild
				}
			})
		}
		e.eventually("some writes before the rebuild", e.limit(), func() bool { return wrote.Load() >= writers*each/3 })
		if g := e.rebuild(); g != 3 {
			t.Fatalf("rebuilt to generation %d, want 3", g)
		}
		wg.Wait()
		e.waitCaughtUp(w.id)
		if g := w.generation(); g != 3 {
			t.Fatalf("published generation %d, want 3", g)
		}
		want, _ = e.liveDocs()
		sameDocs(t, "sink after the raced rebuild", w.docs(), want)
		n3 := 0
		for i, g := range gens {
			if g == 3 {
				n3++
				if want[feed.Key(fmt.Sprintf("r%d", i))] == nil {
					t.Fatalf("r%d was written in generation 3 and is not in the feed", i)
				}
			}
		}
		if n3 == 0 || n3 == len(gens) {
			t.Fatalf("%d of %d writes landed in generation 3; the rebuild raced nothing", n3, len(gens))
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("%d of %d racing writes landed in generation 3; %d records sent since its copy opened", n3, len(gens), len(sent))
		if sent == nil {
			t.Fatal("the worker never opened generation 3's copy")
		}
		for _, d := range sent {
			var v struct{ ID int }
			if err := json.Unmarshal(d, &v); err != nil || v.ID < 0 || gens[v.ID] != 3 {
				t.Fatalf("after generation 3's copy opened, the worker sent %s, a write of generation %d", d, gens[max(v.ID, 0)])
			}
		}
	})
}
