package redis_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/sinks/redis"
)

// rejectedKey holds a list the test wrote itself, in the live namespace and
// in every resync's: the sink must leave it alone and reject its record
// (WRONGTYPE), whatever the document.
const rejectedKey = "rejected: ✗ {tag}"

// harnessMaxDoc lets RunSink store its 1 MiB documents and still try one a
// byte over the limit.
const harnessMaxDoc = 2 << 20

// planted plants the application's list at rejectedKey in each namespace a
// resync opens.
type planted struct {
	*redis.Sink
	tg *target
	t  testing.TB
}

func (p planted) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	rt, err := p.Sink.OpenResync(ctx, g)
	if err == nil {
		p.tg.plant(p.t, rt.(*redis.Resync).Namespace())
	}
	return rt, err
}

func (tg *target) plant(t testing.TB, ns string) {
	if err := tg.admin.RPush(context.Background(), tg.docKey(ns, rejectedKey), "the application's own list").Err(); err != nil {
		t.Errorf("planting a list: %v", err)
	}
}

func harness(t *testing.T, opts redis.Options) (feedtest.SinkHarness, *target) {
	tg := newTarget(t)
	opts.MaxDocumentBytes = harnessMaxDoc
	open := func(t *testing.T) feed.Sink { return planted{Sink: tg.sink(t, opts), tg: tg, t: t} }
	s := open(t)
	ns, err := tg.live(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tg.plant(t, ns)
	return feedtest.SinkHarness{
		Sink: s,
		Contents: func(ctx context.Context) (map[feed.Key]json.RawMessage, error) {
			return tg.contents(ctx, opts.Encoding == redis.EncodingHash, rejectedKey)
		},
		ConditionalOnSeq: true,
		RejectKey:        rejectedKey,
		AtomicPublish:    true,
		MaxDocumentBytes: harnessMaxDoc,
		Fault:            func(t *testing.T) func() { return tg.fault(t) },
		Reopen:           open,
	}, tg
}

func TestSink(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		h, _ := harness(t, redis.Options{})
		return h
	})
}

// TestSinkTTL runs the suite with documents and tombstones that expire,
// long after the suite is done: every write path with PX.
func TestSinkTTL(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		h, _ := harness(t, redis.Options{TTL: 10 * 60e9, TombstoneTTL: 10 * 60e9})
		return h
	})
}
