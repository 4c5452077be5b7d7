package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/internal/metrics"
	"github.com/kairos-es/kairos/syncer"
)

// supervisor runs one syncer.Worker per configured (feed, sink), each under
// a context of its own, so that a reload can stop, start or restart one
// sink's worker and leave every other running: an unchanged sink's worker
// never stops, so it keeps its lease, its session and its place.
//
// The daemon supervises workers itself rather than through syncer.Runner:
// a Runner runs a set of workers fixed when it is built, under one context,
// which is what a library caller wants. Letting that set change while it
// runs would put a lifecycle (add, remove, wait for one worker) into a type
// that callers rely on being simple, for the one program that reloads.
// syncer.NewWorker and Worker.Run are the public pieces a Runner is made
// of, so the daemon builds the same workers and syncer needs nothing new.
type supervisor struct {
	ctx   context.Context // the daemon's: every worker's context derives from it
	store feed.Store
	calls *metrics.Calls
	log   *slog.Logger

	mu      sync.Mutex
	order   []feed.SinkID // the file's order, for States
	sinks   map[feed.SinkID]*supervised
	sealers map[feed.FeedName]*supervised // worker unset: a feed's sealer
	wg      sync.WaitGroup
}

// supervised is one sink's running worker.
type supervised struct {
	spec   sinkSpec
	worker *syncer.Worker
	stop   context.CancelFunc
	done   chan struct{} // closed once the worker has released its lease and the sink is closed
}

// sinkSpec is what decides how one sink's worker runs: its section of the
// file and its feed's worker settings.
type sinkSpec struct {
	id   feed.SinkID
	feed config.Feed // Sinks left out: only the worker settings count
	sink config.Sink
}

// same says two specs run the same worker over the same target. Options
// are compared as decoded (${NAME} expanded), so a comment or a reordering
// of keys changes nothing; a file the section names (a bleve mapping, NATS
// credentials) is read when the sink is built, and a change of that file
// alone is not seen.
func (a sinkSpec) same(b sinkSpec) bool {
	return a.sink.Type == b.sink.Type && reflect.DeepEqual(a.sink.Options, b.sink.Options) &&
		a.feed.Batch == b.feed.Batch && a.feed.BatchBytes == b.feed.BatchBytes && a.feed.PollInterval == b.feed.PollInterval
}

// specs lists the file's sinks in its order.
func specs(cfg *config.Config) []sinkSpec {
	var out []sinkSpec
	for _, f := range cfg.Feeds {
		fs := f
		fs.Sinks = nil
		for _, s := range f.Sinks {
			out = append(out, sinkSpec{id: feed.SinkID{Feed: feed.FeedName(f.Name), Sink: feed.SinkName(s.Name)}, feed: fs, sink: s})
		}
	}
	return out
}

// prepared is a sink built and its worker made, not yet running.
type prepared struct {
	spec   sinkSpec
	built  builtSink
	worker *syncer.Worker
}

// prepare builds spec's sink, checking its target, and its worker.
func (s *supervisor) prepare(spec sinkSpec) (prepared, error) {
	b, err := builders[spec.sink.Type](s.ctx, spec.sink, spec.id, s.log.With("feed", string(spec.id.Feed), "sink", string(spec.id.Sink)))
	if err != nil {
		return prepared{}, err
	}
	w, err := syncer.NewWorker(s.store, spec.id, b.sink, syncer.Options{BatchSize: spec.feed.Batch, BatchBytes: spec.feed.BatchBytes,
		PollInterval: spec.feed.PollInterval, Logger: s.log, Observer: s.calls})
	if err != nil {
		b.close()
		return prepared{}, fmt.Errorf("feeds.%s: %w", spec.id.Feed, err)
	}
	return prepared{spec: spec, built: b, worker: w}, nil
}

// start runs a prepared worker until stop or the daemon's end; its sink is
// closed once the worker has returned, which is after its call in flight
// and the release of its lease.
func (s *supervisor) start(p prepared) {
	ctx, cancel := context.WithCancel(s.ctx)
	sv := &supervised{spec: p.spec, worker: p.worker, stop: cancel, done: make(chan struct{})}
	s.mu.Lock()
	s.sinks[p.spec.id] = sv
	s.mu.Unlock()
	s.wg.Go(func() {
		defer close(sv.done)
		defer p.built.close()
		_ = p.worker.Run(ctx)
	})
}

// stopAll stops the workers of ids together and waits for each to end its
// call in flight, release its lease and close its sink.
func (s *supervisor) stopAll(ids []feed.SinkID) {
	s.mu.Lock()
	var waits []*supervised
	for _, id := range ids {
		if sv := s.sinks[id]; sv != nil {
			sv.stop()
			waits = append(waits, sv)
			delete(s.sinks, id)
		}
	}
	s.mu.Unlock()
	for _, sv := range waits {
		<-sv.done
	}
}

// States returns every running worker's state, in the file's order.
func (s *supervisor) States() []syncer.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]syncer.State, 0, len(s.sinks))
	for _, id := range s.order {
		if sv := s.sinks[id]; sv != nil {
			out = append(out, sv.worker.State())
		}
	}
	return out
}

// Feeds names each feed of the running workers once, in the file's order.
func (s *supervisor) Feeds() []feed.FeedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []feed.FeedName
	seen := map[feed.FeedName]bool{}
	for _, id := range s.order {
		if s.sinks[id] != nil && !seen[id.Feed] {
			seen[id.Feed] = true
			out = append(out, id.Feed)
		}
	}
	return out
}

// count is the number of running workers.
func (s *supervisor) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sinks)
}

// wait blocks until every worker has stopped; the daemon's context ending
// stops them all.
func (s *supervisor) wait() { s.wg.Wait() }

// startAll builds every sink of cfg, then starts their workers: a sink that
// cannot be built stops the start before any worker runs.
func (s *supervisor) startAll(cfg *config.Config) error {
	var ps []prepared
	for _, spec := range specs(cfg) {
		p, err := s.prepare(spec)
		if err != nil {
			for _, p := range ps {
				p.built.close()
			}
			return err
		}
		ps = append(ps, p)
		s.log.Info("sink ready", "feed", string(spec.id.Feed), "sink", string(spec.id.Sink), "type", spec.sink.Type)
	}
	s.setOrder(cfg)
	for _, p := range ps {
		s.start(p)
	}
	return nil
}

func (s *supervisor) setOrder(cfg *config.Config) {
	var order []feed.SinkID
	for _, sp := range specs(cfg) {
		order = append(order, sp.id)
	}
	s.mu.Lock()
	s.order = order
	s.mu.Unlock()
	s.sealFeeds(cfg)
}

// sealFeeds runs one sealer for each feed of cfg and stops those of feeds
// no longer in it, as syncer.Runner does for its targets' feeds: a feed in
// the concurrent write mode gets its seqs from a sealer, and the daemon
// that mirrors it is where one runs without configuration of its own. The
// store's sealer lease lets one process at a time seal a feed; a feed in
// the locked mode costs the sealer one read of its mode now and then. A
// sealer is not restarted by a reload that leaves its feed in the file.
func (s *supervisor) sealFeeds(cfg *config.Config) {
	sl, ok := s.store.(syncer.Sealer)
	if !ok {
		return
	}
	wanted := map[feed.FeedName]bool{}
	for _, f := range cfg.Feeds {
		wanted[feed.FeedName(f.Name)] = true
	}
	s.mu.Lock()
	if s.sealers == nil {
		s.sealers = map[feed.FeedName]*supervised{}
	}
	var stop []*supervised
	for f, sv := range s.sealers {
		if !wanted[f] {
			sv.stop()
			stop = append(stop, sv)
			delete(s.sealers, f)
		}
	}
	for f := range wanted {
		if s.sealers[f] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(s.ctx)
		sv := &supervised{stop: cancel, done: make(chan struct{})}
		s.sealers[f] = sv
		s.wg.Go(func() {
			defer close(sv.done)
			if err := sl.RunSealer(ctx, f); err != nil && ctx.Err() == nil {
				s.log.Error("sealer stopped", "feed", string(f), "error", err)
			}
		})
	}
	s.mu.Unlock()
	for _, sv := range stop {
		<-sv.done
	}
}

// reloadResult says what a reload did.
type reloadResult struct {
	kept, added, removed, restarted int
	// failed are the sinks that could not be built; a restarted sink that
	// failed runs again on its old section.
	failed []error
}

// apply moves the running set to cfg's sinks:
//   - a sink no longer in the file stops: its worker ends after its call in
//     flight and releases its lease;
//   - a sink whose section (or its feed's worker settings) changed stops
//     the same way and starts again on its new section, under a new lease;
//   - a new sink starts;
//   - any other sink's worker is not touched and keeps its lease.
//
// Changed sinks stop before their new section is built, because the old
// and the new one may hold the same thing (a bleve index's lock, a file):
// a changed sink whose new section cannot be built starts again on its old
// one, and the failure is reported. A new sink that cannot be built is
// reported and left out, and the next reload tries it again.
func (s *supervisor) apply(cfg *config.Config) reloadResult {
	var res reloadResult
	want := specs(cfg)
	wanted := make(map[feed.SinkID]bool, len(want))
	for _, sp := range want {
		wanted[sp.id] = true
	}
	s.mu.Lock()
	old := make(map[feed.SinkID]sinkSpec, len(s.sinks))
	for id, sv := range s.sinks {
		old[id] = sv.spec
	}
	s.mu.Unlock()

	var stop []feed.SinkID
	var build []sinkSpec
	for id := range old {
		if !wanted[id] {
			stop = append(stop, id)
			res.removed++
			s.log.Info("reload: sink removed from the file; its worker stops and releases its lease (its cursor stays registered, and holds tombstones back, until kairos sink remove)", "feed", string(id.Feed), "sink", string(id.Sink))
		}
	}
	for _, sp := range want {
		was, ok := old[sp.id]
		switch {
		case !ok:
			build = append(build, sp)
		case !was.same(sp):
			stop = append(stop, sp.id)
			build = append(build, sp)
			s.log.Info("reload: sink's section changed; its worker restarts", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink))
		default:
			res.kept++
		}
	}
	s.stopAll(stop)
	for id := range old {
		if !wanted[id] {
			s.calls.Forget(id)
		}
	}
	s.setOrder(cfg)
	for _, sp := range build {
		was, restart := old[sp.id]
		p, err := s.prepare(sp)
		if err == nil {
			s.start(p)
			if restart {
				res.restarted++
				s.log.Info("reload: sink restarted on its new section", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink), "type", sp.sink.Type)
			} else {
				res.added++
				s.log.Info("reload: sink added", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink), "type", sp.sink.Type)
			}
			continue
		}
		res.failed = append(res.failed, err)
		if !restart {
			s.log.Error("reload: new sink not started: it cannot be built", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink), "error", err)
			continue
		}
		s.log.Error("reload: changed sink cannot be built; it runs again on its old section", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink), "error", err)
		p, err = s.prepare(was)
		if err != nil {
			s.log.Error("reload: sink cannot be built on its old section either; it is not running", "feed", string(sp.id.Feed), "sink", string(sp.id.Sink), "error", err)
			continue
		}
		s.start(p)
	}
	return res
}

// fixed says which settings of next differ from cur among those a running
// daemon cannot change: the database it holds a pool and a store on, the
// lease kind and timings its store was built with, the address it listens
// on and the log's format. It names the keys, never their values.
func fixed(cur, next *config.Config) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(cur.Database.URL != next.Database.URL, "database.url")
	add(cur.Database.ListenURL != next.Database.ListenURL, "database.listen_url")
	add(cur.Database.Schema != next.Database.Schema, "database.schema")
	add(cur.Database.TablePrefix != next.Database.TablePrefix, "database.table_prefix")
	add(leaseKind(cur.Lease.Kind) != leaseKind(next.Lease.Kind), "lease.kind")
	add(cur.Lease.TTL != next.Lease.TTL, "lease.ttl")
	add(cur.Lease.Heartbeat != next.Lease.Heartbeat, "lease.heartbeat")
	add(cur.Lease.Margin != next.Lease.Margin, "lease.margin")
	add(cur.HTTP.Listen != next.HTTP.Listen, "http.listen")
	add(cur.Log.Format != next.Log.Format, "log.format")
	return keys
}

// reloadStatus is the outcome of the last reload, for /metrics and /readyz.
type reloadStatus struct {
	mu          sync.Mutex
	ok          bool      // the last reload (or the start) applied in full
	lastSuccess time.Time // when the configuration last applied in full
	lastAt      time.Time // when the last reload was tried; zero before any
	err         string    // why the last reload failed; "" when it did not
	successes   int64
	failures    int64
}

func newReloadStatus(now time.Time) *reloadStatus {
	return &reloadStatus{ok: true, lastSuccess: now}
}

func (r *reloadStatus) record(now time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastAt = now
	if err == nil {
		r.ok, r.err, r.lastSuccess = true, "", now
		r.successes++
		return
	}
	r.ok, r.err = false, err.Error()
	r.failures++
}

type reloadSnapshot struct {
	OK          bool       `json:"ok"`
	LastSuccess time.Time  `json:"last_success"`
	LastAt      *time.Time `json:"last_reload,omitempty"`
	Error       string     `json:"error,omitempty"`
	Successes   int64      `json:"-"`
	Failures    int64      `json:"-"`
}

func (r *reloadStatus) snapshot() reloadSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := reloadSnapshot{OK: r.ok, LastSuccess: r.lastSuccess, Error: r.err, Successes: r.successes, Failures: r.failures}
	if !r.lastAt.IsZero() {
		at := r.lastAt
		s.LastAt = &at
	}
	return s
}

// errRestartNeeded marks a reload refused because it changes a setting
// only a restart applies.
var errRestartNeeded = errors.New("restart kairos run to apply")
