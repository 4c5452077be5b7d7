package pgfeed_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestCursorWakeAcrossStores: a cursor subscription on one store, with a pool
// and a listener of its own (another process's view of the database), is
// woken by a move made through another store, and not by a move that was
// refused; a subscription to another feed is not woken by it either, and a
// commit to the feed does not wake a cursor subscription.
func TestCursorWakeAcrossStores(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	mover := newStore(t, d, pgfeed.Options{})
	other := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	watcher, err := pgfeed.New(t.Context(), other, pgfeed.Options{Schema: d.schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.Close)
	ctx := t.Context()
	id := feed.SinkID{Feed: "watched", Sink: "s"}
	sub, err := watcher.SubscribeCursors(ctx, id.Feed)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	elsewhere, err := watcher.SubscribeCursors(ctx, "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	drain := func() {
		for _, s := range []feed.Subscription{sub, elsewhere} {
			select {
			case <-s.C():
			default:
			}
		}
	}
	quietFor := func(what string, s feed.Subscription) {
		t.Helper()
		select {
		case <-s.C():
			t.Errorf("%s woke the subscription", what)
		case <-time.After(300 * time.Millisecond):
		}
	}
	drain()
	if _, err := mover.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("k", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	quietFor("a commit to the feed", sub)
	l := mustAcquire(t, mover, ctx, id)
	err = mover.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder() + "-not", Next: feed.Cursor{Generation: 1, Seq: 1}})
	wantErr(t, "a move by the wrong holder", err, feed.ErrCursorSuperseded)
	quietFor("a refused move", sub)
	start := time.Now()
	if err := mover.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
		t.Logf("woken %v after the move returned", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("the other store's move woke no cursor subscription within 10s")
	}
	quietFor("a move of another feed's sink", elsewhere)
}

// TestCursorWakeAfterReconnect terminates the listener's session: once it is
// back, every cursor subscription is signalled (a move made while it was down
// sent a notification nobody heard), and moves wake it again.
func TestCursorWakeAfterReconnect(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	app := fmt.Sprintf("kairos-cursor-listen-%d", time.Now().UnixNano())
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	s := newStore(t, d, pgfeed.Options{Listen: func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }})
	ctx := t.Context()
	id := feed.SinkID{Feed: "reconnect", Sink: "s"}
	if _, err := s.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("k", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	sub, err := s.SubscribeCursors(ctx, id.Feed)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select {
	case <-sub.C():
	default:
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-sub.C():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wake-up within 10s", what)
		}
	}
	terminate(t, d.pool, app)
	woken("the listener's session came back")
	l := mustAcquire(t, s, ctx, id)
	if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	woken("a move after the reconnect")
}

// BenchmarkCASCursor measures a catch-up's cursor move (no park changes) by
// one worker and by eight at once, each with a sink of its own, in moves per
// second: CASCursor (the guard against the generations row and the cursor
// channel's NOTIFY, one statement), the same statement without its NOTIFY,
// and the bare guarded UPDATE the store ran before either, as the baselines,
// taking turns within one run. The NOTIFY's cost
// shows where commits contend: PostgreSQL serialises notifying commits on
// its notify queue lock.
func BenchmarkCASCursor(b *testing.B) {
	d := setupB(b)
	s := newStore(b, d, pgfeed.Options{})
	ctx := b.Context()
	if _, err := s.WriteCommitted(ctx, "bench", []feed.Change{feed.Put("k", []byte(`1`))}); err != nil {
		b.Fatal(err)
	}
	cursors := `"` + d.schema + `"."feed_cursors"`
	generations := `"` + d.schema + `"."feed_generations"`
	bare := `UPDATE ` + cursors + ` SET generation = $4::bigint, seq = $5::bigint, last_advance_at = clock_timestamp()
WHERE feed = $1::text AND sink = $2::text AND lease_holder = $3::text
  AND generation IS NOT DISTINCT FROM $6::bigint AND seq IS NOT DISTINCT FROM $7::bigint`
	guarded := `WITH f AS (
	SELECT coalesce(max(generation), 1) AS generation, coalesce(max(head), 0) AS head FROM ` + generations + ` WHERE feed = $1::text
), m AS (
	UPDATE ` + cursors + ` AS c SET generation = $4::bigint, seq = $5::bigint, last_advance_at = clock_timestamp()
	FROM f
	WHERE c.feed = $1::text AND c.sink = $2::text AND c.lease_holder = $3::text
	  AND c.generation IS NOT DISTINCT FROM $6::bigint AND c.seq IS NOT DISTINCT FROM $7::bigint
	  AND f.generation = $4::bigint AND f.head >= $5::bigint
	RETURNING 1
)
SELECT (SELECT count(*) FROM m), f.generation, f.head FROM f`
	var sinks atomic.Int64
	// mover moves one sink of its own back and forth between seq 0 and 1.
	mover := func(b *testing.B) func() error {
		id := feed.SinkID{Feed: "bench", Sink: feed.SinkName(fmt.Sprintf("s%d", sinks.Add(1)))}
		l := leaseB(b, s, id)
		if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1}}); err != nil {
			b.Fatal(err)
		}
		at := feed.Seq(0)
		return func() error {
			next := 1 - at
			m := feed.CursorMove{ID: id, Holder: l.Holder(), Expected: feed.Cursor{Generation: 1, Seq: at}, Next: feed.Cursor{Generation: 1, Seq: next}}
			at = next
			return s.CASCursor(ctx, m)
		}
	}
	raw := func(sql string) func(b *testing.B) func() error {
		return func(b *testing.B) func() error {
			id := feed.SinkID{Feed: "bench", Sink: feed.SinkName(fmt.Sprintf("s%d", sinks.Add(1)))}
			l := leaseB(b, s, id)
			if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1}}); err != nil {
				b.Fatal(err)
			}
			at := int64(0)
			return func() error {
				next := 1 - at
				rows, err := d.pool.Query(ctx, sql, "bench", string(id.Sink), string(l.Holder()), int64(1), next, int64(1), at)
				if err != nil {
					return err
				}
				rows.Close()
				at = next
				return rows.Err()
			}
		}
	}
	variants := []struct {
		name string
		new  func(b *testing.B) func() error
	}{
		{"store", mover},
		{"without-notify", raw(guarded)},
		{"bare-update", raw(bare)},
	}
	// The variants take turns, a phase of moves each, so that the drift of a
	// shared machine falls on all of them alike.
	const phase = 50
	for _, workers := range []int{1, 8} {
		b.Run(fmt.Sprintf("%d", workers), func(b *testing.B) {
			moves := make([][]func() error, len(variants))
			for i, v := range variants {
				for range workers {
					moves[i] = append(moves[i], v.new(b))
				}
			}
			spent := make([]time.Duration, len(variants))
			n := 0
			for b.Loop() {
				for i := range variants {
					start := time.Now()
					var wg sync.WaitGroup
					for _, move := range moves[i] {
						wg.Go(func() {
							for range phase {
								if err := move(); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
					spent[i] += time.Since(start)
				}
				n += phase * workers
			}
			for i, v := range variants {
				b.ReportMetric(float64(n)/spent[i].Seconds(), v.name+"-moves/s")
			}
		})
	}
}

// leaseB takes id's lease for a benchmark, released when it ends.
func leaseB(b *testing.B, s *pgfeed.Store, id feed.SinkID) feed.Lease {
	b.Helper()
	l, err := s.AcquireLease(b.Context(), id)
	if err != nil {
		b.Fatalf("AcquireLease(%s): %v", id, err)
	}
	b.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}
