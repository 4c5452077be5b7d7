package syncer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// floorSink is a recSink whose targets are feed.FloorSetters: SetFloor is
// logged in the world as a "set-floor" call whose one seq is the floor.
type floorSink struct{ *recSink }

func (s floorSink) OpenResync(ctx context.Context, gen feed.Generation) (feed.ResyncTarget, error) {
	t, err := s.recSink.OpenResync(ctx, gen)
	if err != nil {
		return nil, err
	}
	return floorTarget{t.(*recTarget)}, nil
}

type floorTarget struct{ *recTarget }

func (t floorTarget) SetFloor(ctx context.Context, floor feed.Seq) error {
	c, err := t.s.w.begin(ctx, t.s.worker, t.s.spy, "set-floor", t.gen, []feed.Record{{Seq: floor}}, t.recTarget)
	t.s.w.end(c, err)
	return err
}

// ops lists w's calls as op/gNseqs, SetFloor's with its floor.
func ops(w *world) []string {
	var out []string
	for _, c := range w.log() {
		if c.Op == "set-floor" {
			out = append(out, fmt.Sprintf("set-floor/g%d=%v", c.Gen, c.Seqs))
		} else {
			out = append(out, fmt.Sprintf("%s/g%d", c.Op, c.Gen))
		}
	}
	return out
}

// TestEmptyResyncSetsFloor resyncs a generation whose feed a rebuild left
// empty: the copy is sent no record, so the worker gives it its floor with
// SetFloor, the head its last read saw plus one, before Publish
// (feed.FloorSetter). A target without SetFloor is published as before.
func TestEmptyResyncSetsFloor(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		for i := range 5 {
			e.write(feed.Put(key(i), doc(`{"g":1}`)))
		}
		e.rebuild()
		head, err := e.h.Reader.Head(e.ctx, e.feed)
		if err != nil || head < 5 {
			t.Fatalf("Head = %d, %v; want the 5 seqs of generation 1 still handed out", head, err)
		}

		w := newWorld(e, "search")
		spy := newSpy(e.h.Store)
		start(t, e, e.h.Reader, spy, []syncer.Target{{ID: w.id, Sink: floorSink{w.sinkFor("A", spy)}}}, testOptions(t, e))
		e.waitCaughtUp(w.id)
		want := []string{"open/g2", fmt.Sprintf("set-floor/g2=[%d]", head+1), "publish/g2"}
		if got := ops(w); !slices.Equal(got, want) {
			t.Errorf("calls %v, want %v", got, want)
		}
		if g := w.generation(); g != 2 {
			t.Errorf("published generation %d, want 2", g)
		}
		noProblems(t, w)

		// A target without SetFloor: the same resync, published unchanged.
		plain := newWorld(e, "plain")
		one(t, e, plain, "B", testOptions(t, e))
		e.waitCaughtUp(plain.id)
		if got, want := ops(plain), []string{"open/g2", "publish/g2"}; !slices.Equal(got, want) {
			t.Errorf("a target without SetFloor: calls %v, want %v", got, want)
		}
		if c := e.cursor(plain.id); c.Generation != 2 {
			t.Errorf("a target without SetFloor: cursor %v, want generation 2", c)
		}
		noProblems(t, plain)
	})
}

// TestResyncWithRecordsSetsNoFloor: a copy that was sent records keeps the
// floor of its first batch, and is not given another.
func TestResyncWithRecordsSetsNoFloor(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.write(feed.Put("a", doc(`{"g":1}`)))
		w := newWorld(e, "search")
		spy := newSpy(e.h.Store)
		start(t, e, e.h.Reader, spy, []syncer.Target{{ID: w.id, Sink: floorSink{w.sinkFor("A", spy)}}}, testOptions(t, e))
		e.waitCaughtUp(w.id)
		if got, want := ops(w), []string{"open/g1", "target-apply/g1", "publish/g1"}; !slices.Equal(got, want) {
			t.Errorf("calls %v, want %v", got, want)
		}
		noProblems(t, w)
	})
}
