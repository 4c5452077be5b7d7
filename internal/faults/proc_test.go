package faults_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// worker is one in-process stand-in for a worker process: a store of its
// own (its own pools, so its sessions can be told apart and ended by their
// application name), a sink value per target wrapped by the target's
// recorder, and a runner.
type worker struct {
	name   string
	app    string // application_name of every session of this worker
	store  *pgfeed.Store
	runner *syncer.Runner
	stop   func()
	// leasesDown, once set, makes the worker's advisory pool dial a closed
	// port: its lock sessions, once ended, cannot come back.
	leasesDown atomic.Bool
	// dbDown, once set, makes every pool of the worker dial a closed port:
	// with cut, the worker is as if frozen or partitioned from PostgreSQL.
	dbDown atomic.Bool
}

// newWorker starts a worker over e's feed for targets, each recorded by the
// recorder beside it; advisory picks advisory-lock leases.
func (e *env) newWorker(name string, advisory bool, targets []*target, recs []*recorder, opts syncer.Options) *worker {
	e.t.Helper()
	w := &worker{name: name, app: "kfaults_" + name + "_" + randHex()}
	closed := pgtest.ClosedPort(e.t)
	conf := func(lease bool) func(c *pgxpool.Config) {
		return func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["application_name"] = w.app
			dial := c.ConnConfig.DialFunc
			c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				if w.dbDown.Load() || (lease && w.leasesDown.Load()) {
					return dial(ctx, "tcp", closed)
				}
				return dial(ctx, network, addr)
			}
		}
	}
	pool := pgtest.PoolWith(e.t, e.url, conf(false))
	var leases *pgxpool.Pool
	if advisory {
		leases = pgtest.PoolWith(e.t, e.url, conf(true))
	}
	w.store = e.newStore(pool, leases)
	ts := make([]syncer.Target, len(targets))
	for i, tg := range targets {
		ts[i] = syncer.Target{ID: feed.SinkID{Feed: e.feed, Sink: tg.name}, Sink: recs[i].wrap(name, tg.open(e.t))}
	}
	w.runner, w.stop = run(e.t, w.store, ts, opts)
	return w
}

// holds reports whether w holds every one of its targets' leases.
func (w *worker) holds() bool {
	for _, s := range w.runner.States() {
		if !s.LeaseHeld {
			return false
		}
	}
	return true
}

func (w *worker) String() string { return fmt.Sprintf("worker %s", w.name) }

// cut ends every session of w and keeps new ones from opening until
// restore: its heartbeats, reads and cursor moves fail from now on.
func (e *env) cut(w *worker) {
	e.t.Helper()
	w.dbDown.Store(true)
	if _, err := e.pool.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, w.app); err != nil {
		e.t.Fatalf("ending %s's sessions: %v", w, err)
	}
}

func (w *worker) restore() { w.dbDown.Store(false) }
