package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

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

// callMetrics are the sink calls' durations and failures by operation, fed
// by the workers' syncer.Observer.
type callMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

func newCallMetrics() *callMetrics {
	return &callMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kairos_sink_call_duration_seconds",
			Help:    "How long each sink call took, by operation (apply, open resync, apply resync, publish, abort resync), failed calls included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"feed", "sink", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kairos_sink_errors_total",
			Help: "Sink calls that failed (the sink's fault, retried; rejections are not errors), by operation.",
		}, []string{"feed", "sink", "op"}),
	}
}

// SinkCall implements syncer.Observer.
func (m *callMetrics) SinkCall(id feed.SinkID, op string, took time.Duration, err error) {
	m.duration.WithLabelValues(string(id.Feed), string(id.Sink), op).Observe(took.Seconds())
	if err != nil {
		m.errors.WithLabelValues(string(id.Feed), string(id.Sink), op).Inc()
	}
}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mHead, mCursor, mGeneration, mLag, mParked, mLeaseHeld, mFailing, mWakeUps, mApplied, mSent, mResyncs, mLastAdvance, mLastErrorTime, mPending, mSinceAdvance} {
		ch <- d
	}
}

func b2f(b bool) float64 {
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
		g(mLeaseHeld, b2f(s.LeaseHeld))
		g(mFailing, b2f(failing(s)))
		g(mWakeUps, b2f(s.WakeUps))
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

// reloadCollector shows the last reload's outcome, named as Prometheus
// names its own.
type reloadCollector struct{ status *reloadStatus }

var (
	mReloadOK      = prometheus.NewDesc("kairos_config_last_reload_successful", "1 when the last reload of the configuration (or the start) applied in full; 0 when it was refused or a sink could not be built.", nil, nil)
	mReloadSuccess = prometheus.NewDesc("kairos_config_last_reload_success_timestamp_seconds", "When the configuration last applied in full, as a Unix time.", nil, nil)
	mReloads       = prometheus.NewDesc("kairos_config_reloads_total", "Reloads tried, by result (success or failure).", []string{"result"}, nil)
)

func (c reloadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mReloadOK
	ch <- mReloadSuccess
	ch <- mReloads
}

func (c reloadCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.status.snapshot()
	ch <- prometheus.MustNewConstMetric(mReloadOK, prometheus.GaugeValue, b2f(s.OK))
	ch <- prometheus.MustNewConstMetric(mReloadSuccess, prometheus.GaugeValue, float64(s.LastSuccess.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(mReloads, prometheus.CounterValue, float64(s.Successes), "success")
	ch <- prometheus.MustNewConstMetric(mReloads, prometheus.CounterValue, float64(s.Failures), "failure")
}

// failing says the worker's last fault stands.
func failing(s syncer.State) bool { return s.LastError != nil && s.RecoveredAt.IsZero() }

// settled says the worker holds its lease now, or was refused it by a
// rival it can name: the worker is either doing its job or rightly leaving
// it to another process. A worker that cannot reach the database to take
// its lease is neither, and keeps the daemon unready.
func settled(s syncer.State) bool {
	return s.LeaseHeld || s.WaitingFor != "" || s.Phase == syncer.PhaseStandby
}

// handler serves /healthz, /readyz, /metrics and the feeds' descriptions
// under /v1/feeds.
func handler(sup *supervisor, calls *callMetrics, status *reloadStatus, st pgStore, url string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(workerCollector{states: sup.States}, reloadCollector{status}, calls.duration, calls.errors, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		type sinkReady struct {
			Feed    string `json:"feed"`
			Sink    string `json:"sink"`
			Phase   string `json:"phase"`
			Leased  bool   `json:"lease_held"`
			Failing bool   `json:"failing"`
		}
		var out struct {
			Ready bool        `json:"ready"`
			Sinks []sinkReady `json:"sinks"`
			// Config is the last reload's outcome: a failed one leaves the
			// sinks as they were, so it does not make the daemon unready.
			Config reloadSnapshot `json:"config"`
		}
		out.Ready = true
		out.Sinks = []sinkReady{}
		for _, s := range sup.States() {
			out.Ready = out.Ready && settled(s)
			out.Sinks = append(out.Sinks, sinkReady{Feed: string(s.ID.Feed), Sink: string(s.ID.Sink), Phase: string(s.Phase), Leased: s.LeaseHeld, Failing: failing(s)})
		}
		out.Config = status.snapshot()
		w.Header().Set("Content-Type", "application/json")
		if !out.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	feeds := func(w http.ResponseWriter, r *http.Request, name feed.FeedName) {
		views, err := describe(r.Context(), st, name)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case errors.Is(err, feed.ErrUnknownFeed):
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "unknown feed"})
			return
		case err != nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": redactErr(err, url).Error()})
			return
		}
		if name != "" {
			_ = json.NewEncoder(w).Encode(views[0])
			return
		}
		_ = json.NewEncoder(w).Encode(views)
	}
	mux.HandleFunc("GET /v1/feeds", func(w http.ResponseWriter, r *http.Request) { feeds(w, r, "") })
	mux.HandleFunc("GET /v1/feeds/{feed}", func(w http.ResponseWriter, r *http.Request) {
		name := feed.FeedName(r.PathValue("feed"))
		if err := name.Validate(); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "not a feed name"})
			return
		}
		feeds(w, r, name)
	})
	return mux
}
