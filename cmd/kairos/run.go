package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

func (c *cli) runCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the sync daemon: every feed of the configuration to every sink",
		Long: `run starts one worker per sink of every feed in the configuration file, each
under its lease, so that several daemons over the same database share the
sinks, each sink served by one of them at a time. Every sink is built, and its
target checked, before any worker starts: a sink that cannot be reached or is
configured wrong stops the start with its path in the file.

The HTTP listener (http.listen, default 127.0.0.1:9187) serves /healthz (the
process runs), /readyz (every worker has taken its lease or been refused
it), /metrics (Prometheus) and /v1/feeds, /v1/feeds/FEED (describe, as JSON).

SIGINT or SIGTERM stops the workers, each after its call in flight, releases
their leases so another daemon takes over at once, and exits 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.load()
			if err != nil {
				return err
			}
			if len(cfg.Feeds) == 0 {
				return usagef("%s has no feeds to run", c.configPath)
			}
			return daemon(cmd.Context(), cfg, newLogger(cfg.Log, c.stderr))
		},
	}
}

func newLogger(l config.Log, w io.Writer) *slog.Logger {
	level := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[l.Level]
	opts := &slog.HandlerOptions{Level: level}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// daemon runs every feed's workers until ctx ends.
func daemon(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.Database.URL)
	if err != nil {
		return fmt.Errorf("database.url: %w", redactErr(err, cfg.Database.URL))
	}
	defer pool.Close()
	opts := pgfeed.Options{
		Schema: cfg.Database.Schema, TablePrefix: cfg.Database.TablePrefix,
		Lease:  feed.LeaseOptions{TTL: cfg.Lease.TTL, Heartbeat: cfg.Lease.Heartbeat, Margin: cfg.Lease.Margin},
		Logger: log,
	}
	if cfg.Lease.Kind == "advisory" {
		opts.AdvisoryLock = pool
	}
	st, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		if errors.Is(err, pgfeed.ErrNotMigrated) {
			return fmt.Errorf("%w (run kairos migrate)", err)
		}
		return redactErr(err, cfg.Database.URL)
	}
	defer st.Close()

	var built []builtSink
	defer func() {
		for _, b := range built {
			b.close()
		}
	}()
	var runners []*syncer.Runner
	calls := newCallMetrics()
	for _, f := range cfg.Feeds {
		var targets []syncer.Target
		for _, s := range f.Sinks {
			id := feed.SinkID{Feed: feed.FeedName(f.Name), Sink: feed.SinkName(s.Name)}
			b, err := builders[s.Type](ctx, s, id, log.With("feed", f.Name, "sink", s.Name))
			if err != nil {
				return err
			}
			built = append(built, b)
			targets = append(targets, syncer.Target{ID: id, Sink: b.sink})
			log.Info("sink ready", "feed", f.Name, "sink", s.Name, "type", s.Type)
		}
		r, err := syncer.NewRunner(st, targets, syncer.Options{BatchSize: f.Batch, BatchBytes: f.BatchBytes, PollInterval: f.PollInterval, Logger: log, Observer: calls})
		if err != nil {
			return fmt.Errorf("feeds.%s: %w", f.Name, err)
		}
		runners = append(runners, r)
	}

	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	srv := &http.Server{Handler: handler(runners, calls, pgStore{Store: st, pool: pool}, cfg.Database.URL), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("kairos running", "feeds", len(cfg.Feeds), "sinks", len(built), "http", ln.Addr().String(), "lease", leaseKind(cfg.Lease.Kind))

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { _ = r.Run(ctx) })
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
		stop() // the listener failed: stop the workers too, rather than run unseen
	}
	log.Info("kairos stopping: each worker ends its call in flight and releases its lease")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	if serveErr == nil {
		serveErr = <-served
	}
	wg.Wait()
	log.Info("kairos stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", serveErr)
	}
	return nil
}

func leaseKind(k string) string {
	if k == "" {
		return "row"
	}
	return k
}
