package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/metrics"
	"github.com/kairos-es/kairos/syncer"
)

// measureScrape measures what a Prometheus scrape of the kairos daemon
// costs on a big backlog (row M): ScrapeSinks workers stand Backlog rows
// behind the head of one feed, each holding its lease, and the daemon's own
// registry (internal/metrics, with the Go runtime and process collectors)
// is served over HTTP as kairos run serves it. Each scrape is timed from the
// request to the whole response parsed by the Prometheus text parser, and
// checked: every sink's pending series must show the backlog.
//
// The workers are real: each took its first batch into a sink that then
// holds the next call until the run ends, so their state (head, cursor,
// lease) is what a daemon stuck behind a slow target shows.
func (e *env) measureScrape(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	var p50, p99 []float64
	var bodyBytes int
	for r := range sz.Runs {
		err := func() error {
			s, err := e.newSchema(ctx, admin)
			if err != nil {
				return err
			}
			defer s.drop()
			const first = 1000 // the batch each worker takes before its sink stalls
			rows := sz.Backlog + first
			t0 := time.Now()
			if err := s.fillFeed(ctx, "m", rows, false); err != nil {
				return err
			}
			e.logf("run %d: built %d rows in %v", r+1, rows, time.Since(t0).Round(time.Millisecond))
			pool, err := e.pool(ctx, int32(2*sz.ScrapeSinks+4), nil)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := s.store(ctx, pool)
			if err != nil {
				return err
			}
			defer st.Close()
			runCtx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			calls := metrics.NewCalls()
			var workers []*syncer.Worker
			for i := range sz.ScrapeSinks {
				id := feed.SinkID{Feed: "m", Sink: feed.SinkName(fmt.Sprintf("s%02d", i))}
				if err := s.placeCursor(ctx, id, 0); err != nil {
					return err
				}
				w, err := syncer.NewWorker(st, id, &stallSink{}, syncer.Options{Logger: quiet, BatchSize: first, MoveInterval: -1, PollInterval: time.Minute, Observer: calls})
				if err != nil {
					return err
				}
				workers = append(workers, w)
				wg.Go(func() { _ = w.Run(runCtx) })
			}
			states := func() []syncer.State {
				out := make([]syncer.State, len(workers))
				for i, w := range workers {
					out[i] = w.State()
				}
				return out
			}
			if err := waitFor(ctx, func() bool {
				for _, s := range states() {
					if !s.LeaseHeld || int(s.Head)-int(s.Cursor.Seq) < sz.Backlog {
						return false
					}
				}
				return true
			}); err != nil {
				return err
			}
			// The daemon's tombstone gauge too, read in the background as
			// kairos run reads it, so a scrape serves the same registry.
			tombs := metrics.NewTombstones()
			wg.Go(func() {
				tombs.Run(runCtx, 10*time.Second, func() []feed.FeedName { return []feed.FeedName{"m"} }, st.OldestTombstone, quiet)
			})
			srv := httptest.NewServer(promhttp.HandlerFor(metrics.Registry(states, calls, tombs), promhttp.HandlerOpts{}))
			defer srv.Close()
			scrape := func() (time.Duration, error) {
				start := time.Now()
				resp, err := http.Get(srv.URL)
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				cr := &countingReader{r: resp.Body}
				parser := expfmt.NewTextParser(model.UTF8Validation)
				fams, err := parser.TextToMetricFamilies(cr)
				took := time.Since(start)
				if err != nil {
					return 0, err
				}
				bodyBytes = cr.n
				pending := fams["kairos_sink_pending"].GetMetric()
				if len(pending) != sz.ScrapeSinks {
					return 0, fmt.Errorf("the scrape shows %d sinks' pending, want %d", len(pending), sz.ScrapeSinks)
				}
				for _, m := range pending {
					if v := m.GetGauge().GetValue(); v < float64(sz.Backlog) {
						return 0, fmt.Errorf("the scrape shows %v pending for a sink, want at least %d", v, sz.Backlog)
					}
				}
				return took, nil
			}
			for range 10 { // warm-up: connections, the registry's first gathers
				if _, err := scrape(); err != nil {
					return err
				}
			}
			var took []time.Duration
			for range sz.Scrapes {
				d, err := scrape()
				if err != nil {
					return err
				}
				took = append(took, d)
			}
			slices.Sort(took)
			p50 = append(p50, percentile(took, 0.50))
			p99 = append(p99, percentile(took, 0.99))
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	what := fmt.Sprintf("/metrics scrape of the daemon's registry, %d sinks each %d rows behind, request to parsed response (%d scrapes of %d bytes)", sz.ScrapeSinks, sz.Backlog, sz.Scrapes, bodyBytes)
	return []Row{
		newRow("M p50", what+", p50", "ms", p50, nil, "", nil, "", nil),
		newRow("M p99", "the same, p99", "ms", p99, nil, "", nil, "< 50 ms", func(fig, _ float64) bool { return fig < 50 }),
	}, nil
}

// stallSink takes the first batch, then holds every later call until its
// context ends: a worker over it stands at its first batch with the rest of
// the feed pending, its lease held.
type stallSink struct{ took atomic.Bool }

func (s *stallSink) Apply(ctx context.Context, _ []feed.Record) ([]feed.Rejection, error) {
	if s.took.CompareAndSwap(false, true) {
		return nil, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *stallSink) OpenResync(context.Context, feed.Generation) (feed.ResyncTarget, error) {
	return nil, fmt.Errorf("stallSink: no resync in this measurement")
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
