package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/redis"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd: pgfeed → syncer.Runner → the Redis sink: 10k changes with
// deletes, a rebuild mid-stream, and the sink's connections killed again
// and again (CLIENT KILL ID, by the name Open gave them) while it works.
// The kills are sink errors the worker retries: nothing is parked, and the
// live copy, read back through the Reader, ends with exactly the feed's
// live documents, every retired copy collected.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	store, fpool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	tg := newTarget(t)
	sink, err := redis.Open(ctx, "redis://"+addr()+"/0", redis.Options{Prefix: tg.prefix, ClientName: tg.name})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()

	const f = feed.FeedName("orders")
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: feed.SinkID{Feed: f, Sink: "cache"}, Sink: sink}}, syncer.Options{
		BatchSize: 500, PollInterval: 50 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	defer func() { stop(); <-done }()

	rng := rand.New(rand.NewPCG(12, 0))
	live := map[feed.Key]json.RawMessage{}
	touched := map[feed.Key]bool{}
	written := 0
	write := func(changes []feed.Change) {
		t.Helper()
		if _, err := store.WriteCommitted(ctx, f, changes); err != nil {
			t.Fatalf("WriteCommitted: %v", err)
		}
		written += len(changes)
	}
	round := func() {
		changes := make([]feed.Change, 0, 100)
		seen := map[feed.Key]bool{}
		for len(changes) < 100 {
			k := feed.Key(fmt.Sprintf("order/%04d {%d}", rng.IntN(1500), rng.IntN(3)))
			if seen[k] {
				continue
			}
			seen[k], touched[k] = true, true
			if _, ok := live[k]; ok && rng.IntN(4) == 0 {
				delete(live, k)
				changes = append(changes, feed.Delete(k))
				continue
			}
			d := json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü","pad":"%s"}`, rng.Int64(), written, strings.Repeat("p", 200)))
			live[k] = d
			changes = append(changes, feed.Put(k, d))
		}
		write(changes)
	}

	// A killer ends the sink's connections every few milliseconds while
	// it runs.
	var kills atomic.Int64
	killing := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) && ctx.Err() == nil {
			n, err := tg.killSink(ctx)
			if err != nil && ctx.Err() == nil {
				t.Errorf("CLIENT KILL: %v", err)
				return
			}
			kills.Add(int64(n))
			time.Sleep(3 * time.Millisecond)
		}
	}

	for range 40 {
		round()
	}
	// The first resync publishes before the rebuild, so the rebuild's is a
	// second one (a rebuild landing mid-fill restarts it and counts once).
	if _, err := runner.WaitCaughtUp(ctx); err != nil {
		t.Fatalf("WaitCaughtUp before the rebuild: %v", err)
	}
	if err := pgx.BeginFunc(ctx, fpool, func(tx pgx.Tx) error { _, err := store.ResetTx(ctx, tx, f); return err }); err != nil {
		t.Fatalf("ResetTx: %v", err)
	}
	var all []feed.Change
	for k, d := range live {
		all = append(all, feed.Put(k, d))
	}
	for len(all) > 0 {
		n := min(len(all), 100)
		write(all[:n])
		all = all[n:]
	}
	killDone := make(chan struct{})
	go func() { defer close(killDone); killing(2 * time.Second) }()
	for range 30 {
		round()
	}
	<-killDone
	for written < 10_000 {
		round()
	}
	res, err := runner.WaitCaughtUp(ctx)
	if err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	if len(res[0].Parked) != 0 {
		t.Errorf("parked: %+v; a killed connection must park nothing", res[0].Parked)
	}
	st := runner.States()[0]
	if st.Resyncs < 2 {
		t.Errorf("state %+v: want two resyncs (the first, the rebuild's)", st)
	}
	if st.LastError == nil || !errors.Is(st.LastError, redis.ErrConnection) && !errors.Is(st.LastError, redis.ErrTimeout) {
		t.Errorf("the worker's last error: %v; want the killed connections' (%d kills)", st.LastError, kills.Load())
	} else {
		t.Logf("%d connections killed; the worker's last error: %v", kills.Load(), st.LastError)
	}

	// Read back through the Reader: every key the feed ever touched.
	keys := make([]feed.Key, 0, len(touched))
	for k := range touched {
		keys = append(keys, k)
	}
	got, err := tg.reader(t, "").MGet(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, k := range keys {
		want, ok := live[k]
		switch {
		case ok && !feedtest.JSONEqual(got[i], want):
			bad++
			if bad < 5 {
				t.Errorf("%s: the reader gets %.60s, the feed has %.60s", k, got[i], want)
			}
		case !ok && got[i] != nil:
			bad++
			if bad < 5 {
				t.Errorf("%s: the reader gets %.60s, the feed deleted it", k, got[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys differ from the feed", bad, len(keys))
	}
	// Nothing else is served, and the retired copies go.
	ns, err := tg.live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	docKeys, err := tg.nsKeys(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(docKeys) != len(live) {
		t.Errorf("the live copy holds %d documents, the feed %d", len(docKeys), len(live))
	}
	if _, err := sink.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for k := range tg.dump(t) {
		if !strings.HasPrefix(k, tg.prefix+ns+":") && k != tg.meta() {
			t.Errorf("after a sweep, %s is left of a retired copy", k)
			break
		}
	}
	t.Logf("%d changes, %d keys, %d live", written, len(keys), len(live))
}
