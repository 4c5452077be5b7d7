// Package metrics turns the sync workers' own state into Prometheus
// metrics, read at each scrape: a scrape runs no query and costs the same
// whatever the backlog, since pending is the head minus the cursor as the
// worker last saw them. Names follow Prometheus's conventions under
// kairos_, labelled feed and sink (and op for sink calls); no metric carries
// a key, a document or an error's text, which could hold what a target
// answered. The one figure no worker knows, each feed's oldest tombstone's
// age (Tombstones), is read from the store in the background and only
// looked up at a scrape, so a scrape still runs no query; the daemon's
// tombstone collections (Collections) are counted as they happen. The kairos
// daemon serves them, and the benchmark measures a scrape of the same
// registry.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// Registry is a registry holding the workers' metrics (states is called at
// each scrape), the sink calls' metrics, the Go runtime's and the
// process's, and extra.
func Registry(states func() []syncer.State, calls *Calls, extra ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(workerCollector{states: states}, calls.duration, calls.errors, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(extra...)
	return reg
}

// workerCollector turns the workers' states into metrics at each scrape, so
// the figures are the workers' own and nothing is counted twice. Labels are
// feed and sink; no metric carries an error's text, which could hold what a
// target answered.
type workerCollector struct {
	states func() []syncer.State
}

var (
	labels         = []string{"feed", "sink"}
	mHead          = prometheus.NewDesc("kairos_feed_head", "The feed's head seq at the worker's last read.", labels, nil)
	mCursor        = prometheus.NewDesc("kairos_sink_cursor_seq", "The seq the sink's cursor stands at, as this worker last read or moved it.", labels, nil)
	mGeneration    = prometheus.NewDesc("kairos_sink_cursor_generation", "The generation the sink's cursor is in.", labels, nil)
	mLag           = prometheus.NewDesc("kairos_sink_lag", "Seqs between the head and the cursor when the last read filled a whole batch; 0 when caught up.", labels, nil)
	mParked        = prometheus.NewDesc("kairos_sink_parked", "Records parked for the sink, as far as the worker knows.", labels, nil)
	mLeaseHeld     = prometheus.NewDesc("kairos_sink_lease_held", "1 while this process holds the sink's lease.", labels, nil)
	mFailing       = prometheus.NewDesc("kairos_sink_failing", "1 while the worker's last fault stands (it has not recovered from it yet).", labels, nil)
	mWakeUps       = prometheus.NewDesc("kairos_sink_wakeups", "1 while the worker is subscribed to the feed's wake-ups; 0 means it polls.", labels, nil)
	mApplied       = prometheus.NewDesc("kairos_sink_records_applied_total", "Records the sink took and a cursor move landed past, each once.", labels, nil)
	mSent          = prometheus.NewDesc("kairos_sink_records_sent_total", "Records handed to the sink in calls that change it, resends included.", labels, nil)
	mResyncs       = prometheus.NewDesc("kairos_sink_resyncs_total", "Resyncs published.", labels, nil)
	mLastAdvance   = prometheus.NewDesc("kairos_sink_last_advance_timestamp_seconds", "When this worker last moved the cursor, as a Unix time; absent if never.", labels, nil)
	mLastErrorTime = prometheus.NewDesc("kairos_sink_last_error_timestamp_seconds", "When the worker last met a fault, as a Unix time; absent if never.", labels, nil)
	mPending       = prometheus.NewDesc("kairos_sink_pending", "Seqs between the head and the cursor at the worker's last read: an upper bound on the records still to send (compaction leaves gaps).", labels, nil)
	mSinceAdvance  = prometheus.NewDesc("kairos_sink_seconds_since_last_advance", "Seconds since this worker last moved the cursor; absent if never.", labels, nil)
)

// Calls are the sink calls' durations and failures by operation, fed
// by the workers' syncer.Observer.
type Calls struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// NewCalls makes the sink calls' metrics; the workers feed them as their
// syncer.Options.Observer.
func NewCalls() *Calls {
	return &Calls{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kairos_sink_call_duration_seconds",
			Help:    "How long each sink call took, by operation (apply, open resync, apply resync, set resync floor, publish, abort resync), failed calls included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"feed", "sink", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kairos_sink_errors_total",
			Help: "Sink calls that failed (the sink's fault, retried; rejections are not errors), by operation.",
		}, []string{"feed", "sink", "op"}),
	}
}

// SinkCall implements syncer.Observer.
func (m *Calls) SinkCall(id feed.SinkID, op string, took time.Duration, err error) {
	m.duration.WithLabelValues(string(id.Feed), string(id.Sink), op).Observe(took.Seconds())
	if err != nil {
		m.errors.WithLabelValues(string(id.Feed), string(id.Sink), op).Inc()
	}
}

// Forget drops the series of a sink the daemon no longer serves, so a sink
// removed from the configuration leaves /metrics rather than showing its
// last figures for ever.
func (m *Calls) Forget(id feed.SinkID) {
	l := prometheus.Labels{"feed": string(id.Feed), "sink": string(id.Sink)}
	m.duration.DeletePartialMatch(l)
	m.errors.DeletePartialMatch(l)
}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mHead, mCursor, mGeneration, mLag, mParked, mLeaseHeld, mFailing, mWakeUps, mApplied, mSent, mResyncs, mLastAdvance, mLastErrorTime, mPending, mSinceAdvance} {
		ch <- d
	}
}

// B2F is 1 for true, 0 for false.
func B2F(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.states() {
		l := []string{string(s.ID.Feed), string(s.ID.Sink)}
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		n := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
		}
		g(mHead, float64(s.Head))
		g(mCursor, float64(s.Cursor.Seq))
		g(mGeneration, float64(s.Cursor.Generation))
		g(mLag, float64(s.Lag))
		g(mPending, float64(max(0, int64(s.Head)-int64(s.Cursor.Seq))))
		g(mParked, float64(s.Parked))
		g(mLeaseHeld, B2F(s.LeaseHeld))
		g(mFailing, B2F(Failing(s)))
		g(mWakeUps, B2F(s.WakeUps))
		n(mApplied, float64(s.RecordsApplied))
		n(mSent, float64(s.RecordsSent))
		n(mResyncs, float64(s.Resyncs))
		if !s.LastAdvance.IsZero() {
			g(mLastAdvance, float64(s.LastAdvance.UnixNano())/1e9)
			g(mSinceAdvance, time.Since(s.LastAdvance).Seconds())
		}
		if !s.LastErrorAt.IsZero() {
			g(mLastErrorTime, float64(s.LastErrorAt.UnixNano())/1e9)
		}
	}
}

// Failing says the worker's last fault stands.
func Failing(s syncer.State) bool { return s.LastError != nil && s.RecoveredAt.IsZero() }
