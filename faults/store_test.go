package faults_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestLostReadReply: the reply of one of the worker's feed reads is lost on a
// connection that stays open, while the rest of its pool, its lease's
// renewals included, works. The read ends at syncer's StoreTimeout as a fault
// the worker backs off from and retries on another connection, so it catches
// up within that bound, its backoff and some slack, instead of waiting for the
// kernel to give up on a connection it thinks alive. I1, I2 and I4 hold as
// everywhere.
func TestLostReadReply(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(200)
	mem := memfeed.NewSink(memfeed.SinkOptions{})
	p := newProxy(t, upstreamHost(t))
	// The simple protocol, so that every answer carries its row description
	// and a feed read's answer can be told by its columns (pgfeed's read
	// starts with a row of NULL::text, the generation and the head).
	store := e.store(e.pool(p.addr, pgx.QueryExecModeSimpleProtocol, 4), pgfeed.Options{Lease: rowLease})
	cut := p.swallowReplies(pgRowDescription("text", "generation", "to_jsonb"))
	opts := testOptions()
	opts.StoreTimeout = 2 * time.Second
	e.startWorker("A", store, "s", mem, opts, false)
	e.caughtUp("s", 30*time.Second)

	cut.left.Store(1)
	load := e.writeLoad(200, 5*time.Millisecond)
	e.eventually("a feed read's answer to be swallowed", 20*time.Second, func() bool { return cut.made.Load() == 1 })
	load.halt()
	e.caughtUp("s", opts.StoreTimeout+opts.BackoffMax+5*time.Second)
	e.finalChecks("s", load, mem, 30*time.Second)
}
