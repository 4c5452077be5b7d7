package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/pgfeed"
)

// feedView is one feed as describe shows it; the json and yaml outputs are
// these fields, so scripts get the same facts the table shows.
type feedView struct {
	Feed       string `json:"feed" yaml:"feed"`
	Generation int64  `json:"generation" yaml:"generation"`
	Head       int64  `json:"head" yaml:"head"`
	// Mode is the feed's write mode, locked or concurrent. In the
	// concurrent mode Unsealed counts the keys whose latest write waits
	// for the sealer (no sink's pending counts them yet), and the sealer's
	// lease is shown like a sink's.
	Mode                   string     `json:"mode" yaml:"mode"`
	Unsealed               int64      `json:"unsealed,omitempty" yaml:"unsealed,omitempty"`
	SealerHolder           string     `json:"sealer_holder,omitempty" yaml:"sealer_holder,omitempty"`
	SealerExpiresAt        *time.Time `json:"sealer_expires_at,omitempty" yaml:"sealer_expires_at,omitempty"`
	SealerExpiresInSeconds *float64   `json:"sealer_expires_in_seconds,omitempty" yaml:"sealer_expires_in_seconds,omitempty"`
	// OldestTombstoneAt is when the feed's oldest tombstone was made, and
	// OldestTombstoneAgeSeconds how long ago on the database's clock;
	// both absent when the feed holds none. An age that keeps growing says
	// collection is held back (kairos collect says by which sink) or never
	// runs.
	OldestTombstoneAt         *time.Time `json:"oldest_tombstone_at,omitempty" yaml:"oldest_tombstone_at,omitempty"`
	OldestTombstoneAgeSeconds *float64   `json:"oldest_tombstone_age_seconds,omitempty" yaml:"oldest_tombstone_age_seconds,omitempty"`
	Sinks                     []sinkView `json:"sinks" yaml:"sinks"`
}

type sinkView struct {
	Sink string `json:"sink" yaml:"sink"`
	// CursorGeneration and CursorSeq are 0 before the sink's first resync
	// finished.
	CursorGeneration int64 `json:"cursor_generation" yaml:"cursor_generation"`
	CursorSeq        int64 `json:"cursor_seq" yaml:"cursor_seq"`
	// Resyncing: the cursor is in an older generation than the feed's, so
	// the sink is filling a fresh copy.
	Resyncing     bool       `json:"resyncing" yaml:"resyncing"`
	Pending       int64      `json:"pending" yaml:"pending"`
	LastAdvanceAt *time.Time `json:"last_advance_at,omitempty" yaml:"last_advance_at,omitempty"`
	// LastAdvanceAgeSeconds and LeaseExpiresInSeconds are measured on the
	// database's clock, as the leases are.
	LastAdvanceAgeSeconds *float64   `json:"last_advance_age_seconds,omitempty" yaml:"last_advance_age_seconds,omitempty"`
	LeaseHolder           string     `json:"lease_holder,omitempty" yaml:"lease_holder,omitempty"`
	LeaseExpiresAt        *time.Time `json:"lease_expires_at,omitempty" yaml:"lease_expires_at,omitempty"`
	LeaseExpiresInSeconds *float64   `json:"lease_expires_in_seconds,omitempty" yaml:"lease_expires_in_seconds,omitempty"`
	Parked                int        `json:"parked" yaml:"parked"`
}

func view(d feed.Description, now time.Time) feedView {
	v := feedView{Feed: string(d.Feed), Generation: int64(d.Generation), Head: int64(d.Head), Mode: string(d.Mode), Unsealed: d.Unsealed, Sinks: []sinkView{}}
	if v.Mode == "" {
		v.Mode = string(feed.WriteLocked)
	}
	if d.Sealer != nil && d.Sealer.Holder != "" {
		at, in := d.Sealer.ExpiresAt, d.Sealer.ExpiresAt.Sub(now).Seconds()
		v.SealerHolder, v.SealerExpiresAt, v.SealerExpiresInSeconds = string(d.Sealer.Holder), &at, &in
	}
	if !d.OldestTombstone.IsZero() {
		at, age := d.OldestTombstone, max(0, now.Sub(d.OldestTombstone).Seconds())
		v.OldestTombstoneAt, v.OldestTombstoneAgeSeconds = &at, &age
	}
	for _, s := range d.Sinks {
		sv := sinkView{
			Sink:             string(s.Sink),
			CursorGeneration: int64(s.Cursor.Generation),
			CursorSeq:        int64(s.Cursor.Seq),
			Resyncing:        s.Cursor.Generation < d.Generation,
			Pending:          s.Pending,
			Parked:           len(s.Parked),
		}
		if !s.LastAdvance.IsZero() {
			at, age := s.LastAdvance, now.Sub(s.LastAdvance).Seconds()
			sv.LastAdvanceAt, sv.LastAdvanceAgeSeconds = &at, &age
		}
		if s.Lease != nil {
			at, in := s.Lease.ExpiresAt, s.Lease.ExpiresAt.Sub(now).Seconds()
			sv.LeaseHolder, sv.LeaseExpiresAt, sv.LeaseExpiresInSeconds = string(s.Lease.Holder), &at, &in
		}
		v.Sinks = append(v.Sinks, sv)
	}
	return v
}

// output is the -o flag's value.
type output string

func (o *output) String() string { return string(*o) }
func (o *output) Type() string   { return "table|json|yaml" }
func (o *output) Set(s string) error {
	switch s {
	case "table", "json", "yaml":
		*o = output(s)
		return nil
	}
	return fmt.Errorf("want table, json or yaml")
}

func (c *cli) describeCmd() *cobra.Command {
	out := output("table")
	var watch bool
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "describe [FEED]",
		Short: "Show where a feed and each of its sinks stand",
		Long: `describe shows a feed's generation and head, and for each sink: its cursor,
how many rows it has still to see (pending), when its cursor last moved, who
holds its lease and for how long yet, and how many records are parked for it.
A sink whose cursor is in an older generation is resyncing. Without FEED it
shows every feed. When the feed holds tombstones, the age of the oldest one
follows its head: one that keeps growing says collection is held back (kairos
collect says by which sink) or never runs. Ages and expiries are measured on
the database's clock, as leases are.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("describe takes at most one feed, got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if every <= 0 {
				return usagef("--interval must be positive")
			}
			var name feed.FeedName
			if len(args) == 1 {
				name = feed.FeedName(args[0])
				if err := name.Validate(); err != nil {
					return usageError{err}
				}
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			terminal := isTerminal(c.stdout)
			for {
				views, err := describe(cmd.Context(), st, name)
				if err != nil {
					if watch && cmd.Context().Err() != nil {
						return nil
					}
					if name != "" && errors.Is(err, feed.ErrUnknownFeed) {
						err = capturedHint(cmd.Context(), st, name, err)
					}
					return redactErr(err, cfg.Database.URL)
				}
				if watch && terminal {
					fmt.Fprint(c.stdout, "\x1b[H\x1b[2J") // home and clear: refresh in place
				}
				if watch {
					fmt.Fprintf(c.stdout, "every %v, %s\n\n", every, time.Now().Format(time.TimeOnly))
				}
				if err := render(c.stdout, out, views, terminal); err != nil {
					return err
				}
				if !watch {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	cmd.Flags().VarP(&out, "output", "o", "output format: table, json or yaml")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "refresh until interrupted")
	cmd.Flags().DurationVar(&every, "interval", 2*time.Second, "how often --watch refreshes")
	return cmd
}

type pgStore struct {
	*pgfeed.Store
	pool *pgxpool.Pool
}

// Now is the database's clock, which leases run on.
func (s pgStore) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}

// open loads the configuration and opens its feed store: what every
// operator verb starts with.
func (c *cli) open(ctx context.Context) (*config.Config, pgStore, func(), error) {
	cfg, err := c.load()
	if err != nil {
		return nil, pgStore{}, nil, err
	}
	st, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return nil, pgStore{}, nil, err
	}
	return cfg, st, closeStore, nil
}

// openStore connects to the configuration's database and opens its feed
// store, which checks the schema is migrated.
func openStore(ctx context.Context, cfg *config.Config) (pgStore, func(), error) {
	pool, err := pgxpool.New(ctx, cfg.Database.URL)
	if err != nil {
		return pgStore{}, nil, fmt.Errorf("database.url: %w", redactErr(err, cfg.Database.URL))
	}
	st, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: cfg.Database.Schema, TablePrefix: cfg.Database.TablePrefix})
	if err != nil {
		pool.Close()
		return pgStore{}, nil, redactErr(connectErr(err), cfg.Database.URL)
	}
	return pgStore{Store: st, pool: pool}, func() { st.Close(); pool.Close() }, nil
}

// connectErr names the setting behind a failure to reach the database,
// which pgfeed reports as an unreadable schema check; other errors pass.
func connectErr(err error) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("database.url: %w", ce)
	}
	return err
}

// capturedHint adds to the unknown-feed error of a feed that a capture
// writes but nothing has written yet (Capture copies no row) what to run.
func capturedHint(ctx context.Context, st pgStore, name feed.FeedName, err error) error {
	caps, cerr := st.Captures(ctx)
	if cerr != nil {
		return err
	}
	for _, ci := range caps {
		if ci.Feed == name {
			return fmt.Errorf("%w; it captures %s.%s, whose rows reach it with the first write or kairos backfill %s", err, ci.Schema, ci.Table, name)
		}
	}
	return err
}

func describe(ctx context.Context, st pgStore, name feed.FeedName) ([]feedView, error) {
	names := []feed.FeedName{name}
	if name == "" {
		var err error
		if names, err = st.Feeds(ctx); err != nil {
			return nil, err
		}
	}
	now, err := st.Now(ctx)
	if err != nil {
		return nil, err
	}
	views := []feedView{}
	for _, n := range names {
		d, err := st.Describe(ctx, n)
		if err != nil {
			return nil, err
		}
		views = append(views, view(d, now))
	}
	return views, nil
}

// leaseText is a lease holder with the time it has left, or since it
// lapsed.
func leaseText(holder string, in float64) string {
	if in > 0 {
		return fmt.Sprintf("%s (%s left)", holder, age(in))
	}
	return fmt.Sprintf("%s (lapsed %s ago)", holder, age(-in))
}

func render(w io.Writer, out output, views []feedView, terminal bool) error {
	switch out {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	case "yaml":
		b, err := yaml.Marshal(views)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	if len(views) == 0 {
		_, err := fmt.Fprintln(w, "no feeds yet")
		return err
	}
	bold, warn, reset := "", "", ""
	if terminal {
		bold, warn, reset = "\x1b[1m", "\x1b[33m", "\x1b[0m"
	}
	for i, v := range views {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%sfeed %s%s  generation %d  head %d", bold, v.Feed, reset, v.Generation, v.Head)
		if v.OldestTombstoneAgeSeconds != nil {
			fmt.Fprintf(w, "  oldest tombstone %s ago", age(*v.OldestTombstoneAgeSeconds))
		}
		fmt.Fprintln(w)
		if v.Mode == string(feed.WriteConcurrent) {
			sealer := "none"
			if v.SealerHolder != "" {
				sealer = leaseText(v.SealerHolder, *v.SealerExpiresInSeconds)
			}
			fmt.Fprintf(w, "  concurrent write mode  unsealed %d  sealer %s\n", v.Unsealed, sealer)
		}
		if len(v.Sinks) == 0 {
			fmt.Fprintln(w, "  no sinks registered")
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SINK\tCURSOR\tPENDING\tLAST ADVANCE\tLEASE\tPARKED")
		for _, s := range v.Sinks {
			cursor := "none"
			if s.CursorGeneration > 0 {
				cursor = fmt.Sprintf("%d/%d", s.CursorGeneration, s.CursorSeq)
			}
			if s.Resyncing {
				cursor += " (resyncing)"
			}
			advance := "never"
			if s.LastAdvanceAgeSeconds != nil {
				advance = age(*s.LastAdvanceAgeSeconds) + " ago"
			}
			lease := "free"
			if s.LeaseHolder != "" {
				lease = leaseText(s.LeaseHolder, *s.LeaseExpiresInSeconds)
			}
			parked := fmt.Sprint(s.Parked)
			if s.Parked > 0 {
				parked = warn + parked + reset
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\n", s.Sink, cursor, s.Pending, advance, lease, parked)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// age prints seconds as an operator reads them: 12s, 3m04s, 2h05m, 3d4h.
func age(sec float64) string {
	d := time.Duration(sec * float64(time.Second)).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// isTerminal says whether w is a terminal, where colour and in-place
// refresh make sense; pipes and files get plain text.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
