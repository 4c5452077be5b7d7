package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// invalidAsUsage makes a spec the store refused a usage mistake (exit 2):
// the operator typed it.
func invalidAsUsage(err error) error {
	var inv *feed.InvalidError
	if errors.As(err, &inv) {
		return usageError{err}
	}
	return err
}

func (c *cli) captureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capture",
		Short: "Capture a table into a feed with triggers: add, remove, list",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var key, include, exclude []string
	var document string
	var printSQL bool
	add := &cobra.Command{
		Use:   "add FEED [SCHEMA.]TABLE",
		Short: "Install (or bring up to date) the triggers that write TABLE's changes into FEED",
		Long: `add installs statement-level triggers on the table that write the feed rows
of every INSERT, UPDATE, DELETE and COPY in the writing transaction, and move
the feed to a new generation on TRUNCATE (see pgfeed's Capture). It is
idempotent: the same spec again changes nothing. The table's schema defaults
to public; names are the catalog's own spelling and are quoted. Rows already
in the table are not copied: run kairos backfill. --print prints the SQL
instead, for a migration tool of your own.`,
		Args: exactArgs(2, "FEED [SCHEMA.]TABLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := pgfeed.CaptureSpec{Feed: feed.FeedName(args[0]), Table: args[1],
				Key: key, Include: include, Exclude: exclude, Document: document}
			if s, t, ok := strings.Cut(args[1], "."); ok {
				spec.Schema, spec.Table = s, t
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			if printSQL {
				sql, err := st.CaptureSQL(cmd.Context(), spec)
				if err != nil {
					return invalidAsUsage(redactErr(err, cfg.Database.URL))
				}
				_, err = fmt.Fprint(c.stdout, sql)
				return err
			}
			info, err := st.Capture(cmd.Context(), spec)
			if err != nil {
				return invalidAsUsage(redactErr(err, cfg.Database.URL))
			}
			verb := "unchanged"
			if info.Changed {
				verb = "installed"
			}
			fmt.Fprintf(c.stdout, "%s: %s.%s -> feed %s, key %s, version %s\n", verb, info.Schema, info.Table, info.Feed, strings.Join(info.Key, ","), info.Version)
			return nil
		},
	}
	add.Flags().StringSliceVar(&key, "key", nil, "the key's columns, in order (default: the primary key)")
	add.Flags().StringSliceVar(&include, "include", nil, "the columns the document keeps (default: all)")
	add.Flags().StringSliceVar(&exclude, "exclude", nil, "the columns the document drops")
	add.Flags().StringVar(&document, "document", "", "a SQL expression over the row r giving its document (your own SQL)")
	add.Flags().BoolVar(&printSQL, "print", false, "print the SQL instead of running it")
	remove := &cobra.Command{
		Use:   "remove FEED",
		Short: "Remove FEED's capture triggers; the feed's rows stay",
		Args:  exactArgs(1, "FEED"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := feed.FeedName(args[0])
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			removed, err := st.Uncapture(cmd.Context(), f)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			if !removed {
				return fmt.Errorf("feed %s captures no table", f)
			}
			fmt.Fprintf(c.stdout, "removed the capture of feed %s\n", f)
			return nil
		},
	}
	var check bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the captured tables, and the gaps in their triggers",
		Long: `list prints every captured table with its feed, key and version, then a
warning line for each gap in a capture's triggers: a table of the capture
(a partition created or attached since, or any table whose capture trigger
was dropped or disabled) whose writes do not reach the feed, or a table no
longer captured (a partition detached since) that still writes into it.
"kairos capture add" with the same arguments closes the gaps; a backfill
refuses until then. --check exits 1 when any capture has a gap, 0
otherwise, for an alert.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			caps, err := st.Captures(cmd.Context())
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			if len(caps) == 0 {
				_, err := fmt.Fprintln(c.stdout, "no captured tables")
				return err
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FEED\tTABLE\tKEY\tVERSION")
			for _, ci := range caps {
				k := strings.Join(ci.Key, ",")
				if k == "" {
					k = "(primary key)"
				}
				fmt.Fprintf(tw, "%s\t%s.%s\t%s\t%s\n", ci.Feed, ci.Schema, ci.Table, k, ci.Version)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			gaps := 0
			for _, ci := range caps {
				for _, t := range ci.Uncovered {
					fmt.Fprintf(c.stdout, "warning: feed %s: %s has no enabled capture triggers, so its writes do not reach the feed; run kairos capture add again\n", ci.Feed, t)
				}
				for _, t := range ci.Stray {
					fmt.Fprintf(c.stdout, "warning: feed %s: %s is no longer %s.%s or under it but still carries its capture triggers, so its writes reach the feed; run kairos capture add again\n", ci.Feed, t, ci.Schema, ci.Table)
				}
				if len(ci.Uncovered)+len(ci.Stray) > 0 {
					gaps++
				}
			}
			if check && gaps > 0 {
				return fmt.Errorf("%d of %d captures have gaps in their triggers", gaps, len(caps))
			}
			return nil
		},
	}
	list.Flags().BoolVar(&check, "check", false, "exit 1 when any capture has a gap in its triggers")
	cmd.AddCommand(add, remove, list)
	return cmd
}

func (c *cli) backfillCmd() *cobra.Command {
	var batch int
	var generation bool
	cmd := &cobra.Command{
		Use:   "backfill FEED",
		Short: "Copy a captured table's rows into its feed, while writers write",
		Long: `backfill copies every row of the table FEED captures into the feed, in
batches in key order, each under the feed lock, so a writer's change always
wins over the copy (see pgfeed's Backfill). In place (the default) it is
resumable: run it again after a crash or ^C and it continues where the last
batch committed. --new-generation copies into a new generation in one
transaction instead: every sink refills and publishes, and the table's
writers wait until it commits. Progress goes to stderr.`,
		Args: exactArgs(1, "FEED"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := feed.FeedName(args[0])
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			var last time.Time
			res, err := st.Backfill(cmd.Context(), pgfeed.BackfillOptions{Feed: f, BatchSize: batch, NewGeneration: generation,
				Progress: func(p pgfeed.BackfillProgress) {
					if time.Since(last) < time.Second && !p.Done {
						return
					}
					last = time.Now()
					fmt.Fprintf(c.stderr, "backfill %s: %d of about %d rows, %.0f rows/s, %v left\n", p.Feed, p.Rows, p.Total, p.Rate, p.ETA.Round(time.Second))
				}})
			if err != nil {
				return invalidAsUsage(redactErr(err, cfg.Database.URL))
			}
			resumed := ""
			if res.Resumed {
				resumed = ", resumed"
			}
			fmt.Fprintf(c.stdout, "backfilled %d rows into feed %s (generation %d, head %d%s)\n", res.Rows, f, res.Generation, res.Head, resumed)
			return nil
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 0, fmt.Sprintf("rows per batch (default %d)", pgfeed.DefaultBackfillBatch))
	cmd.Flags().BoolVar(&generation, "new-generation", false, "copy into a new generation, in one transaction (a rebuild)")
	return cmd
}
