package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/redis"
)

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into the Redis sink, its
// connections killed again and again after the rebuild (CLIENT KILL ID, by
// the name Open gave them) while it works. The kills are sink errors the
// worker retries: nothing is parked, and the live copy, read back through
// the Reader, ends with exactly the feed's live documents, every retired
// copy collected.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tg := newTarget(t)
	sink, err := redis.Open(ctx, "redis://"+addr()+"/0", redis.Options{Prefix: tg.prefix, ClientName: tg.name})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()

	// The outage: a killer ends the sink's connections every few
	// milliseconds, for two seconds and until the scenario, which goes on
	// writing, has seen the worker meet it (a kill fails only a command in
	// flight; a connection killed while idle is replaced unseen).
	var kills atomic.Int64
	killing := func(d time.Duration, stop <-chan struct{}) {
		end := time.Now().Add(d)
		for ctx.Err() == nil {
			select {
			case <-stop:
				if !time.Now().Before(end) {
					return
				}
			default:
			}
			n, err := tg.killSink(ctx)
			if err != nil && ctx.Err() == nil {
				t.Errorf("CLIENT KILL: %v", err)
				return
			}
			kills.Add(int64(n))
			time.Sleep(3 * time.Millisecond)
		}
	}
	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{
		Sink: "cache",
		Seed: 12,
		Keys: 4500,
		Key:  func(i int) feed.Key { return feed.Key(fmt.Sprintf("order/%04d {%d}", i/3, i%3)) },
		Doc: func(rng *rand.Rand, n int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü","pad":"%s"}`, rng.Int64(), n, strings.Repeat("p", 200)))
		},
		Fault: func() func() {
			stop, killDone := make(chan struct{}), make(chan struct{})
			go func() { defer close(killDone); killing(2*time.Second, stop) }()
			return func() { close(stop); <-killDone }
		},
	})
	live := m.Live
	if st := m.State; !errors.Is(st.LastError, redis.ErrConnection) && !errors.Is(st.LastError, redis.ErrTimeout) {
		t.Errorf("the worker's last error: %v; want the killed connections' (%d kills)", st.LastError, kills.Load())
	} else {
		t.Logf("%d connections killed", kills.Load())
	}

	// Read back through the Reader: every key the feed ever touched.
	keys := m.Touched
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
	t.Logf("%d changes, %d keys, %d live", m.Written, len(keys), len(live))
}
