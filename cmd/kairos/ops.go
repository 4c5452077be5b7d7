package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
)

// sinkID reads FEED SINK arguments.
func sinkID(args []string) (feed.SinkID, error) {
	id := feed.SinkID{Feed: feed.FeedName(args[0]), Sink: feed.SinkName(args[1])}
	if err := id.Validate(); err != nil {
		return id, usageError{err}
	}
	return id, nil
}

// exactArgs refuses any other number of arguments as a usage mistake,
// naming them.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			got := fmt.Sprintf("%d arguments", len(args))
			if len(args) == 1 {
				got = "1 argument"
			}
			return usagef("%s takes %s, got %s (see %s --help)", cmd.CommandPath(), names, got, cmd.CommandPath())
		}
		return nil
	}
}

// parkedView is one parked record as the json and yaml outputs show it.
type parkedView struct {
	Key      string    `json:"key" yaml:"key"`
	Seq      int64     `json:"seq" yaml:"seq"`
	Reason   string    `json:"reason" yaml:"reason"`
	ParkedAt time.Time `json:"parked_at" yaml:"parked_at"`
}

func (c *cli) parkedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List and retry the records a sink refused",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	out := output("table")
	list := &cobra.Command{
		Use:   "list FEED SINK",
		Short: "List the records parked for a sink, with why",
		Args:  exactArgs(2, "FEED SINK"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := sinkID(args)
			if err != nil {
				return err
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			recs, err := st.ReadParked(cmd.Context(), id)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			views := make([]parkedView, len(recs))
			for i, r := range recs {
				views[i] = parkedView{Key: string(r.Key), Seq: int64(r.Seq), Reason: r.Reason, ParkedAt: r.ParkedAt}
			}
			return renderParked(c.stdout, out, id, views)
		},
	}
	list.Flags().VarP(&out, "output", "o", "output format: table, json or yaml")
	var all bool
	retry := &cobra.Command{
		Use:   "retry FEED SINK KEY... | --all",
		Short: "Send parked records to the sink again",
		Long: `retry unparks each KEY for the sink and gives the key's row a fresh seq, so
every sink sees the key again after its cursor; fix what the sink refused
first. A key that is not parked for the sink is reported and left alone.
With --all, every record parked for the sink is retried.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) < 2:
				return usagef("%s takes FEED SINK and keys, or --all", cmd.CommandPath())
			case all && len(args) > 2:
				return usagef("%s takes keys or --all, not both", cmd.CommandPath())
			case !all && len(args) == 2:
				return usagef("%s needs the keys to retry, or --all", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := sinkID(args[:2])
			if err != nil {
				return err
			}
			keys := make([]feed.Key, 0, len(args)-2)
			for _, k := range args[2:] {
				if err := feed.Key(k).Validate(); err != nil {
					return usageError{err}
				}
				keys = append(keys, feed.Key(k))
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			if all {
				recs, err := st.ReadParked(cmd.Context(), id)
				if err != nil {
					return redactErr(err, cfg.Database.URL)
				}
				for _, r := range recs {
					keys = append(keys, r.Key)
				}
			}
			retried, missing := 0, 0
			for _, k := range keys {
				ok, err := st.RetryParked(cmd.Context(), id, k)
				if err != nil {
					return fmt.Errorf("after %d of %d keys retried: %w", retried, len(keys), redactErr(err, cfg.Database.URL))
				}
				if ok {
					retried++
					fmt.Fprintf(c.stdout, "retried %q\n", string(k))
				} else {
					missing++
					fmt.Fprintf(c.stdout, "not parked for %s: %q\n", id, string(k))
				}
			}
			fmt.Fprintf(c.stdout, "%d retried, %d not parked\n", retried, missing)
			if missing > 0 && !all {
				return fmt.Errorf("%d of the keys given %s not parked for %s", missing, plural(missing, "was", "were"), id)
			}
			return nil
		},
	}
	retry.Flags().BoolVar(&all, "all", false, "retry every record parked for the sink")
	cmd.AddCommand(list, retry)
	return cmd
}

func renderParked(w io.Writer, out output, id feed.SinkID, views []parkedView) error {
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
		_, err := fmt.Fprintf(w, "nothing parked for %s\n", id)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSEQ\tPARKED AT\tREASON")
	for _, v := range views {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", v.Key, v.Seq, v.ParkedAt.UTC().Format(time.RFC3339), v.Reason)
	}
	return tw.Flush()
}

func (c *cli) sinkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sink",
		Short: "Manage a feed's registered sinks",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "remove FEED SINK",
		Short: "Forget a sink: its cursor and its parked records",
		Long: `remove deletes the sink's cursor and parked list, so it no longer holds back
tombstone collection. It is refused while a worker holds the sink's lease
(exit code 3), naming the holder and when its lease lapses: stop that
worker first, or remove the sink from its configuration.`,
		Args: exactArgs(2, "FEED SINK"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := sinkID(args)
			if err != nil {
				return err
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			removed, err := st.RemoveSink(cmd.Context(), id)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			if !removed {
				return fmt.Errorf("%s is not registered", id)
			}
			fmt.Fprintf(c.stdout, "removed %s\n", id)
			return nil
		},
	})
	return cmd
}

func (c *cli) collectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "collect FEED",
		Short: "Delete the tombstones every sink has passed",
		Long: `collect deletes the feed's tombstones that every registered sink's cursor
has passed, and says what it kept and why: the sink whose cursor is lowest
holds back every tombstone above it, a resyncing sink holds back all of them,
and a key parked for any sink keeps its tombstone until it is retried.
kairos run does the same on its own every collect.interval; collect is for
now, and for saying what holds tombstones back.`,
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
			if _, err := st.Describe(cmd.Context(), f); err != nil { // an unknown feed is refused first
				return redactErr(err, cfg.Database.URL)
			}
			n, err := st.CollectTombstones(cmd.Context(), f)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			fmt.Fprintf(c.stdout, "collected %d %s\n", n, plural(n, "tombstone", "tombstones"))
			d, err := st.Describe(cmd.Context(), f)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			var low *feed.SinkState
			parked := 0
			for i := range d.Sinks {
				s := &d.Sinks[i]
				parked += len(s.Parked)
				if s.Cursor.Generation < d.Generation {
					fmt.Fprintf(c.stdout, "%s is resyncing (cursor %s, feed at generation %d): it holds back every tombstone\n", s.Sink, cursorText(s.Cursor), d.Generation)
					continue
				}
				if low == nil || s.Cursor.Seq < low.Cursor.Seq {
					low = s
				}
			}
			switch {
			case len(d.Sinks) == 0:
				fmt.Fprintln(c.stdout, "no sink is registered; every tombstone is kept until one passes it")
			case low != nil && low.Cursor.Seq < d.Head:
				fmt.Fprintf(c.stdout, "%s holds back tombstones above seq %d (its cursor; head is %d)\n", low.Sink, low.Cursor.Seq, d.Head)
			}
			if parked > 0 {
				fmt.Fprintf(c.stdout, "%d parked %s keep their tombstones until retried\n", parked, plural(parked, "record", "records"))
			}
			return nil
		},
	}
}

func cursorText(c feed.Cursor) string {
	if c.IsZero() {
		return "none"
	}
	return fmt.Sprintf("%d/%d", c.Generation, c.Seq)
}
