package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/internal/metrics"
	"github.com/kairos-es/kairos/pgfeed"
)

func (c *cli) runCmd() *cobra.Command {
	var poll, tombstonePoll time.Duration
	cmd := &cobra.Command{
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
A scrape runs no query: each figure is the workers' own, but for the age of
each feed's oldest tombstone, read in the background every --tombstone-poll.

Every collect.interval (default 1m; 0 turns it off) the daemon collects each
feed's tombstones that every registered sink has passed, as kairos collect
does by hand: a sink that lags, has no cursor yet, or has the key parked
keeps them. The first collection waits a random part of the interval, so
daemons over the same database do not collect in step; a failed one is
logged and tried again at the next interval.

SIGHUP, or a change of the file's content (looked for every --config-poll),
reloads the sinks: the file is checked in full first, and one with mistakes
is logged and leaves every worker as it was. Then sinks removed from the file
stop, new ones start, those whose section changed restart, and the others
keep running under the lease they hold; log.level and collect.interval apply
at once. A change to database, lease,
http.listen or log.format is refused with a log line: those need a restart.

SIGINT or SIGTERM stops the workers, each after its call in flight, releases
their leases so another daemon takes over at once, and exits 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if poll < 0 {
				return usagef("--config-poll is %v; want a positive interval, or 0 to reload on SIGHUP only", poll)
			}
			if tombstonePoll <= 0 {
				return usagef("--tombstone-poll is %v; want a positive interval", tombstonePoll)
			}
			cfg, err := c.load()
			if err != nil {
				return err
			}
			if len(cfg.Feeds) == 0 {
				return usagef("%s has no feeds to run", c.configPath)
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer func() { signal.Stop(hup); close(hup) }()
			reloads := make(chan struct{}, 1)
			go func() {
				for range hup {
					select {
					case reloads <- struct{}{}:
					default: // one is already due
					}
				}
			}()
			level := new(slog.LevelVar)
			return daemon(cmd.Context(), cfg, newLogger(cfg.Log, level, c.stderr), daemonOptions{
				load: c.load, path: c.configPath, poll: poll, reloads: reloads, level: level,
				tombstonePoll: tombstonePoll,
			})
		},
	}
	cmd.Flags().DurationVar(&poll, "config-poll", defaultConfigPoll, "how often to look for a change of the configuration file's content, which reloads it (0: on SIGHUP only)")
	cmd.Flags().DurationVar(&tombstonePoll, "tombstone-poll", defaultTombstonePoll, "how often to read each feed's oldest tombstone for kairos_feed_oldest_tombstone_age_seconds (one index probe per feed)")
	return cmd
}

// defaultConfigPoll is how often kairos run reads its configuration file
// to see whether it changed.
const defaultConfigPoll = 2 * time.Second

// defaultTombstonePoll is how often kairos run reads each feed's oldest
// tombstone. The age grows between reads on its own; what waits for the
// next read is a collection, which drops the figure to the next tombstone's
// age (or 0), and that can wait this long in a metric watched over hours.
const defaultTombstonePoll = 10 * time.Second

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// newLogger logs in the file's format at level, which it sets to the file's
// level; a reload may change the level later, not the format.
func newLogger(l config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	level.Set(logLevels[l.Level])
	opts := &slog.HandlerOptions{Level: level}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// daemonOptions are how the daemon reloads its configuration.
type daemonOptions struct {
	// load reads and checks the file again.
	load func() (*config.Config, error)
	// path is the file, read every poll to see whether its content changed;
	// poll 0 reads it only on a reload request.
	path string
	poll time.Duration
	// reloads asks for a reload (SIGHUP).
	reloads <-chan struct{}
	// level is the log's level, which a reload may change.
	level *slog.LevelVar
	// tombstonePoll is how often each feed's oldest tombstone is read;
	// zero means defaultTombstonePoll.
	tombstonePoll time.Duration
}

// daemon runs every feed's workers until ctx ends, reloading the sinks
// when asked to or when the file changes.
func daemon(ctx context.Context, cfg *config.Config, log *slog.Logger, do daemonOptions) error {
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
	if lu := cfg.Database.ListenURL; lu != "" {
		lc, err := pgx.ParseConfig(lu)
		if err != nil {
			return usageError{fmt.Errorf("database.listen_url: %w", redactErr(err, lu))}
		}
		opts.Listen = func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := pgx.ConnectConfig(ctx, lc)
			if err != nil {
				return nil, fmt.Errorf("database.listen_url: %w", redactErr(err, lu))
			}
			return conn, nil
		}
	}
	st, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		var inv *feed.InvalidError
		if errors.As(err, &inv) && inv.Field == "options.advisory_lock" {
			// The file asked for advisory leases over a database URL
			// that reaches a transaction pooler: a mistake in the file,
			// so it exits as one.
			return usageError{fmt.Errorf("lease.kind: advisory: %w", redactErr(err, cfg.Database.URL))}
		}
		return redactErr(connectErr(err), cfg.Database.URL)
	}
	defer st.Close()

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	calls := metrics.NewCalls()
	sup := &supervisor{ctx: ctx, store: st, calls: calls, log: log, sinks: map[feed.SinkID]*supervised{}}
	defer sup.wait()
	// Listen before any worker starts, so an address in use stops the start
	// with nothing sent; serve once they run, so /readyz never answers for
	// an empty set.
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	if err := sup.startAll(cfg); err != nil {
		ln.Close()
		return err
	}
	hash, _ := fileHash(do.path)
	status := newReloadStatus(time.Now())
	tombs := metrics.NewTombstones()
	if do.tombstonePoll <= 0 {
		do.tombstonePoll = defaultTombstonePoll
	}
	tombsDone := make(chan struct{})
	go func() {
		defer close(tombsDone)
		tombs.Run(ctx, do.tombstonePoll, sup.Feeds, st.OldestTombstone, log)
	}()
	defer func() { stop(); <-tombsDone }()
	// Collection starts once the workers run: a worker that registers its
	// sink's first cursor holds the feed's tombstones back from then on.
	collections := metrics.NewCollections()
	col := newCollector(cfg.Collect.Interval)
	col.collect, col.feeds, col.counts, col.log, col.url = st.CollectTombstones, sup.Feeds, collections, log, cfg.Database.URL
	col.collected = func(ctx context.Context, f feed.FeedName) {
		_ = tombs.Read(ctx, f, max(do.tombstonePoll, time.Second), st.OldestTombstone) // a failure leaves the next poll to it
	}
	colDone := make(chan struct{})
	go func() {
		defer close(colDone)
		col.run(ctx)
	}()
	defer func() { stop(); <-colDone }()
	srv := &http.Server{Handler: handler(sup, calls, status, tombs, collections, pgStore{Store: st, pool: pool}, cfg.Database.URL), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("kairos running", "feeds", len(cfg.Feeds), "sinks", sup.count(), "http", ln.Addr().String(), "lease", leaseKind(cfg.Lease.Kind), "collect_interval", collectText(cfg.Collect.Interval))

	var tick <-chan time.Time
	if do.poll > 0 && do.path != "" {
		t := time.NewTicker(do.poll)
		defer t.Stop()
		tick = t.C
	}
	reload := func(why string) {
		next, err := do.load()
		if err == nil {
			if keys := fixed(cfg, next); len(keys) > 0 {
				err = fmt.Errorf("%s changed, which a running daemon cannot apply; %w (the sinks keep running as they were)", strings.Join(keys, ", "), errRestartNeeded)
			} else if len(next.Feeds) == 0 {
				err = fmt.Errorf("%s has no feeds; the sinks keep running as they were (stop kairos run to stop them all)", do.path)
			}
		}
		if err != nil {
			status.record(time.Now(), err)
			var ce config.Errors
			if errors.As(err, &ce) {
				for _, e := range ce {
					log.Error("reload refused: the configuration has a mistake; the sinks keep running as they were", "trigger", why, "mistake", e.Error())
				}
				return
			}
			log.Error("reload refused", "trigger", why, "error", err)
			return
		}
		if do.level != nil {
			do.level.Set(logLevels[next.Log.Level])
		}
		col.setInterval(next.Collect.Interval)
		res := sup.apply(next)
		cfg = next
		if len(res.failed) > 0 {
			status.record(time.Now(), fmt.Errorf("%d %s could not be built: %w", len(res.failed), plural(len(res.failed), "sink", "sinks"), errors.Join(res.failed...)))
		} else {
			status.record(time.Now(), nil)
		}
		log.Info("reloaded", "trigger", why, "kept", res.kept, "added", res.added, "removed", res.removed, "restarted", res.restarted, "failed", len(res.failed), "sinks", sup.count())
	}

	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case serveErr = <-served:
			break loop // the listener failed: stop the workers too, rather than run unseen
		case <-do.reloads:
			hash, _ = fileHash(do.path)
			reload("SIGHUP")
		case <-tick:
			h, err := fileHash(do.path)
			if err != nil || h == hash {
				continue // unreadable for a moment (being replaced), or unchanged
			}
			hash = h
			reload("file changed")
		}
	}
	stop()
	log.Info("kairos stopping: each worker ends its call in flight and releases its lease")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	if serveErr == nil {
		serveErr = <-served
	}
	sup.wait()
	log.Info("kairos stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", serveErr)
	}
	return nil
}

// fileHash is a digest of the file's content. Polling the content, rather
// than watching the directory for events (fsnotify), sees every way a file
// gets replaced — written in place, renamed over, a Kubernetes ConfigMap's
// symlink swapped — the same way, on every platform, with no dependency, at
// the cost of reading a small file every poll.
func fileHash(path string) ([sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// collectText is collect.interval as the log shows it.
func collectText(d time.Duration) string {
	if d == 0 {
		return "off"
	}
	return d.String()
}

func leaseKind(k string) string {
	if k == "" {
		return "row"
	}
	return k
}
