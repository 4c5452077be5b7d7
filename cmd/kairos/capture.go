package main

import (
	"errors"
	"fmt"
	"strconv"
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

// captureFields are the names pgfeed's errors give the fields of a
// CaptureSpec and BackfillOptions, and what the operator typed for each.
var captureFields = []struct{ field, arg string }{
	{"spec.feed", "FEED"}, {"spec.schema", "SCHEMA (of [SCHEMA.]TABLE)"}, {"spec.table", "TABLE"},
	{"spec.key", "--key"}, {"spec.include", "--include"}, {"spec.exclude", "--exclude"},
	{"spec.document", "--document"}, {"options.feed", "FEED"}, {"options.batch_size", "--batch"},
	{"options.workers", "--workers"},
}

// inFlags restates an error pgfeed returned for a capture or a backfill in
// the command's terms: the argument or flag for the field, and the command
// for the Go call its advice names. Other errors pass unchanged. It runs
// before redactErr, which keeps the type it finds.
func inFlags(err error) error {
	inv, ok := err.(*feed.InvalidError)
	if !ok {
		return err
	}
	out := *inv
	for _, f := range captureFields {
		if out.Field == f.field || strings.HasPrefix(out.Field, f.field+"[") {
			out.Field = f.arg + strings.TrimPrefix(out.Field, f.field)
			break
		}
	}
	for _, r := range [][2]string{{"and spec.exclude", "and --exclude"}, {"run Capture again", "run kairos capture add again"},
		{"run Capture first", "run kairos capture add first"}, {"with NewGeneration", "with --new-generation"}} {
		out.Reason = strings.ReplaceAll(out.Reason, r[0], r[1])
	}
	return &out
}

// documentFlags is the capture add flag that gave a spec its document, so
// the same capture can be run again: "(the row)" when none did.
func documentFlags(spec pgfeed.CaptureSpec) string {
	switch {
	case len(spec.Include) > 0:
		return "--include " + strings.Join(spec.Include, ",")
	case len(spec.Exclude) > 0:
		return "--exclude " + strings.Join(spec.Exclude, ",")
	case spec.Document != "":
		return "--document " + strconv.Quote(spec.Document)
	}
	return "(the row)"
}

// backfillState says in a few words how far a feed's last backfill got.
func backfillState(b *pgfeed.BackfillState) string {
	switch {
	case b == nil:
		return "none"
	case !b.Current:
		return fmt.Sprintf("%d rows under an earlier spec (the next starts over)", b.Rows)
	case b.Finished.IsZero():
		return fmt.Sprintf("stopped at %d rows, %s (run it again to resume)", b.Rows, b.Updated.UTC().Format(time.DateTime))
	}
	return fmt.Sprintf("done, %d rows, %s", b.Rows, b.Finished.UTC().Format(time.DateTime))
}

// parseTable splits the [SCHEMA.]TABLE argument. Names are the catalog's
// own spelling, so SQL's quotes would become part of the name: they are
// refused with the spelling to use instead.
func parseTable(arg string) (schema, table string, err error) {
	if strings.Contains(arg, `"`) {
		return "", "", usagef("TABLE %q: give the names as the catalog spells them, without SQL quotes (say app.Order Items for \"app\".\"Order Items\"); kairos quotes them itself", arg)
	}
	schema, table, ok := strings.Cut(arg, ".")
	if !ok {
		return "", arg, nil
	}
	if schema == "" || table == "" {
		return "", "", usagef("TABLE %q: the schema and the table must both be named, as SCHEMA.TABLE (or TABLE alone, in schema public)", arg)
	}
	return schema, table, nil
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
	var printSQL, move bool
	add := &cobra.Command{
		Use:   "add FEED [SCHEMA.]TABLE",
		Short: "Install (or bring up to date) the triggers that write TABLE's changes into FEED",
		Long: `add installs statement-level triggers on the table that write the feed rows
of every INSERT, UPDATE, DELETE and COPY in the writing transaction, and move
the feed to a new generation on TRUNCATE (see pgfeed's Capture). It is
idempotent: the same spec again changes nothing. The table's schema defaults
to public; names are the catalog's own spelling and are quoted. Rows already
in the table are not copied: run kairos backfill. --print prints the SQL
instead, for a migration tool of your own.

The table's writers need no rights on the feed's schema: the triggers write
the feed as the role that ran add. A feed captures one table: naming a
feed that captures another table is refused unless --move is given.`,
		Args: exactArgs(2, "FEED [SCHEMA.]TABLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := feed.FeedName(args[0])
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			schema, table, err := parseTable(args[1])
			if err != nil {
				return err
			}
			spec := pgfeed.CaptureSpec{Feed: f, Schema: schema, Table: table,
				Key: key, Include: include, Exclude: exclude, Document: document}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			if printSQL {
				sql, err := st.CaptureSQL(cmd.Context(), spec)
				if err != nil {
					return invalidAsUsage(redactErr(inFlags(err), cfg.Database.URL))
				}
				_, err = fmt.Fprintf(c.stdout, "-- Run this as one transaction (psql --single-transaction), as the role\n-- that owns the feed's tables and may create triggers on %s.\n%s", args[1], sql)
				return err
			}
			// Capture moves a feed whose capture names another table; the
			// feed then holds both tables' rows until a rebuild, which an
			// operator who mistyped a feed name would not expect.
			caps, err := st.Captures(cmd.Context())
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			var from string
			for _, ci := range caps {
				if ci.Feed != f {
					continue
				}
				wantSchema := schema
				if wantSchema == "" {
					wantSchema = "public"
				}
				if ci.Schema != wantSchema || ci.Table != table {
					from = ci.Schema + "." + ci.Table
				}
			}
			if from != "" && !move {
				return usagef("feed %s captures table %s already; capturing %s instead would move the feed, which would then hold the rows of both tables until a rebuild (kairos backfill %s --new-generation). Pass --move to do that, or name another feed", f, from, args[1], f)
			}
			info, err := st.Capture(cmd.Context(), spec)
			if err != nil {
				return invalidAsUsage(redactErr(inFlags(err), cfg.Database.URL))
			}
			verb := "unchanged"
			if info.Changed {
				verb = "installed"
			}
			if from != "" {
				verb = "moved from " + from
			}
			fmt.Fprintf(c.stdout, "%s: %s.%s -> feed %s, key %s, version %s\n", verb, info.Schema, info.Table, info.Feed, strings.Join(info.Key, ","), info.Version)
			if from != "" {
				fmt.Fprintf(c.stdout, "the feed still holds the rows of %s: run kairos backfill %s --new-generation to rebuild it from %s.%s alone\n", from, f, info.Schema, info.Table)
			}
			return nil
		},
	}
	add.Flags().StringSliceVar(&key, "key", nil, "the key's columns, in order (default: the primary key)")
	add.Flags().StringSliceVar(&include, "include", nil, "the columns the document keeps (default: all)")
	add.Flags().StringSliceVar(&exclude, "exclude", nil, "the columns the document drops")
	add.Flags().StringVar(&document, "document", "", "a SQL expression over the row r giving its document (your own SQL)")
	add.Flags().BoolVar(&printSQL, "print", false, "print the SQL instead of running it")
	add.Flags().BoolVar(&move, "move", false, "let a feed that captures another table move to this one")
	remove := &cobra.Command{
		Use:   "remove FEED",
		Short: "Remove FEED's capture triggers; the feed's rows stay",
		Long: `remove drops the triggers that write FEED from its table, and the capture's
record; the feed's rows stay, and sinks keep what they have. It exits 1 when
FEED captures no table, so a script notices a mistyped name.`,
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
		Long: `list prints every captured table with its feed, key, document (the flag
that chose it), last backfill and version, then a warning line for each gap
in a capture's triggers: a table of the capture (a partition created or
attached since, or any table whose capture trigger was dropped or disabled)
whose writes do not reach the feed, or a table no longer captured (a
partition detached since) that still writes into it. "kairos capture add"
with the same arguments (the row's FEED, TABLE, --key and document flag)
closes the gaps; a backfill refuses until then. --check exits 1 when any
capture has a gap, 0 otherwise, for an alert.`,
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
			fmt.Fprintln(tw, "FEED\tTABLE\tKEY\tDOCUMENT\tBACKFILL\tVERSION")
			for _, ci := range caps {
				k := strings.Join(ci.Key, ",")
				if k == "" {
					k = "(primary key)"
				}
				fmt.Fprintf(tw, "%s\t%s.%s\t%s\t%s\t%s\t%s\n", ci.Feed, ci.Schema, ci.Table, k, documentFlags(ci.Spec), backfillState(ci.Backfill), ci.Version)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			gaps := 0
			for _, ci := range caps {
				for _, t := range ci.Uncovered {
					fmt.Fprintf(c.stdout, "warning: feed %s: %s lacks a capture trigger or has one disabled, so writes to it do not all reach the feed; run kairos capture add again\n", ci.Feed, t)
				}
				for _, t := range ci.Stray {
					fmt.Fprintf(c.stdout, "warning: feed %s: %s is no longer %s.%s or under it but still carries its capture triggers, so its writes reach the feed; run kairos capture add again\n", ci.Feed, t, ci.Schema, ci.Table)
				}
				if len(ci.Uncovered)+len(ci.Stray) > 0 {
					gaps++
				}
			}
			if check && gaps > 0 {
				if gaps == 1 {
					return fmt.Errorf("1 of %d captures has a gap in its triggers", len(caps))
				}
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
	var batch, workers int
	var generation bool
	cmd := &cobra.Command{
		Use:   "backfill FEED",
		Short: "Copy a captured table's rows into its feed, while writers write",
		Long: `backfill copies every row of the table FEED captures into the feed, in
batches in key order, from --workers connections at once, each copying a
share of the table, and so that a writer's change always wins over the
copy (see pgfeed's Backfill). In place (the default) it is resumable: run
it again after a crash or ^C and each share continues where its last batch
committed. A backfill that finished starts over when run again: it copies
every row anew, and each is a change every sink applies again.
--new-generation copies into a new generation instead: every sink refills
and publishes, keys no longer in the table are gone from every sink, and
the table's writers wait until the generation moves (a crash or ^C leaves
the feed as it was). Progress goes to stderr.`,
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
			res, err := st.Backfill(cmd.Context(), pgfeed.BackfillOptions{Feed: f, BatchSize: batch, NewGeneration: generation, Workers: workers,
				Progress: func(p pgfeed.BackfillProgress) {
					if time.Since(last) < time.Second && !p.Done {
						return
					}
					last = time.Now()
					if p.Done {
						fmt.Fprintf(c.stderr, "backfill %s: %d rows, %.0f rows/s, done\n", p.Feed, p.Rows, p.Rate)
						return
					}
					fmt.Fprintf(c.stderr, "backfill %s: %d of about %d rows, %.0f rows/s, %v left\n", p.Feed, p.Rows, p.Total, p.Rate, p.ETA.Round(time.Second))
				}})
			if err != nil {
				if cmd.Context().Err() != nil {
					if generation {
						fmt.Fprintf(c.stderr, "backfill %s: interrupted; the feed is as it was (its generation, its rows)\n", f)
					} else {
						fmt.Fprintf(c.stderr, "backfill %s: interrupted after %d rows; run kairos backfill %s again to resume\n", f, res.Rows, f)
					}
				}
				return invalidAsUsage(redactErr(inFlags(err), cfg.Database.URL))
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
	cmd.Flags().BoolVar(&generation, "new-generation", false, "copy into a new generation, published whole (a rebuild)")
	cmd.Flags().IntVar(&workers, "workers", 0, fmt.Sprintf("connections copying at once (default %d; 1 copies one batch at a time, each under the feed lock)", pgfeed.DefaultBackfillWorkers))
	return cmd
}
