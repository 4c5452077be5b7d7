package main

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/metrics"
	"github.com/kairos-es/kairos/syncer"
)

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
	ch <- prometheus.MustNewConstMetric(mReloadOK, prometheus.GaugeValue, metrics.B2F(s.OK))
	ch <- prometheus.MustNewConstMetric(mReloadSuccess, prometheus.GaugeValue, float64(s.LastSuccess.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(mReloads, prometheus.CounterValue, float64(s.Successes), "success")
	ch <- prometheus.MustNewConstMetric(mReloads, prometheus.CounterValue, float64(s.Failures), "failure")
}

// settled says the worker holds its lease now, or was refused it by a
// rival it can name: the worker is either doing its job or rightly leaving
// it to another process. A worker that cannot reach the database to take
// its lease is neither, and keeps the daemon unready.
func settled(s syncer.State) bool {
	return s.LeaseHeld || s.WaitingFor != "" || s.Phase == syncer.PhaseStandby
}

// handler serves /healthz, /readyz, /metrics and the feeds' descriptions
// under /v1/feeds.
func handler(sup *supervisor, calls *metrics.Calls, status *reloadStatus, tombs *metrics.Tombstones, collections *metrics.Collections, st pgStore, url string) http.Handler {
	reg := metrics.Registry(sup.States, calls, reloadCollector{status}, tombs, collections)
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
			out.Sinks = append(out.Sinks, sinkReady{Feed: string(s.ID.Feed), Sink: string(s.ID.Sink), Phase: string(s.Phase), Leased: s.LeaseHeld, Failing: metrics.Failing(s)})
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
