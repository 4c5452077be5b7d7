package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// traceView is a key's trace as the json and yaml outputs show it.
type traceView struct {
	Feed       string          `json:"feed" yaml:"feed"`
	Key        string          `json:"key" yaml:"key"`
	Generation int64           `json:"generation" yaml:"generation"`
	Head       int64           `json:"head" yaml:"head"`
	Found      bool            `json:"found" yaml:"found"`
	Seq        int64           `json:"seq,omitempty" yaml:"seq,omitempty"`
	Deleted    bool            `json:"deleted" yaml:"deleted"`
	Doc        json.RawMessage `json:"doc,omitempty" yaml:"-"`
	DocText    string          `json:"-" yaml:"doc,omitempty"`
	// Unsealed says a write of the key in the concurrent mode waits for
	// the sealer; UnsealedDoc is its document, absent for a delete
	// (UnsealedDeleted). No sink sees it until it is sealed.
	Unsealed        bool            `json:"unsealed,omitempty" yaml:"unsealed,omitempty"`
	UnsealedDeleted bool            `json:"unsealed_deleted,omitempty" yaml:"unsealed_deleted,omitempty"`
	UnsealedDoc     json.RawMessage `json:"unsealed_doc,omitempty" yaml:"-"`
	UnsealedText    string          `json:"-" yaml:"unsealed_doc,omitempty"`
	// Recorded says a captured change of the key waits for the sealer,
	// which reads its document from the table when it seals it.
	Recorded bool        `json:"recorded,omitempty" yaml:"recorded,omitempty"`
	Sinks    []traceSink `json:"sinks" yaml:"sinks"`
}

type traceSink struct {
	Sink         string `json:"sink" yaml:"sink"`
	Cursor       string `json:"cursor" yaml:"cursor"`
	State        string `json:"state" yaml:"state"`
	Ahead        int64  `json:"ahead,omitempty" yaml:"ahead,omitempty"`
	ParkedSeq    int64  `json:"parked_seq,omitempty" yaml:"parked_seq,omitempty"`
	ParkedReason string `json:"parked_reason,omitempty" yaml:"parked_reason,omitempty"`
}

func (c *cli) traceCmd() *cobra.Command {
	out := output("table")
	cmd := &cobra.Command{
		Use:   "trace FEED KEY",
		Short: "Show where one key stands in the feed and in every sink",
		Long: `trace shows one key's row in the feed — its seq and document, or its
tombstone — and for each sink whether it has that version: applied, pending
(with how many rows come before it), parked (with the sink's reason),
resyncing (the sink is filling a fresh copy), or absent (the feed has no row
for the key: never written, or deleted and its tombstone collected).`,
		Args: exactArgs(2, "FEED KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, key := feed.FeedName(args[0]), feed.Key(args[1])
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			if err := key.Validate(); err != nil {
				return usageError{err}
			}
			cfg, st, closeStore, err := c.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeStore()
			tr, err := st.Trace(cmd.Context(), f, key)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			return renderTrace(c.stdout, out, traceOf(tr))
		},
	}
	cmd.Flags().VarP(&out, "output", "o", "output format: table, json or yaml")
	return cmd
}

func traceOf(tr pgfeed.KeyTrace) traceView {
	v := traceView{Feed: string(tr.Feed), Key: string(tr.Key), Generation: int64(tr.Generation), Head: int64(tr.Head),
		Found: tr.Found, Seq: int64(tr.Seq), Deleted: tr.Found && tr.Doc == nil, Doc: tr.Doc, DocText: string(tr.Doc), Sinks: []traceSink{},
		Unsealed: tr.Unsealed, UnsealedDeleted: tr.Unsealed && tr.UnsealedDoc == nil, UnsealedDoc: tr.UnsealedDoc, UnsealedText: string(tr.UnsealedDoc), Recorded: tr.Recorded}
	for _, s := range tr.Sinks {
		ts := traceSink{Sink: string(s.Sink), Cursor: cursorText(s.Cursor), State: string(s.State), Ahead: s.Ahead}
		if s.Parked != nil {
			ts.ParkedSeq, ts.ParkedReason = int64(s.Parked.Seq), s.Parked.Reason
		}
		v.Sinks = append(v.Sinks, ts)
	}
	return v
}

// maxDocShown bounds the document the table prints; -o json prints it all.
const maxDocShown = 200

func renderTrace(w io.Writer, out output, v traceView) error {
	switch out {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	switch {
	case !v.Found && (v.Unsealed || v.Recorded):
		fmt.Fprintf(w, "feed %s (generation %d, head %d): key %q has no sealed row yet\n", v.Feed, v.Generation, v.Head, v.Key)
	case !v.Found:
		fmt.Fprintf(w, "feed %s (generation %d, head %d) has no row for key %q: never written, or deleted and collected\n", v.Feed, v.Generation, v.Head, v.Key)
	case v.Deleted:
		fmt.Fprintf(w, "feed %s (generation %d, head %d): key %q deleted at seq %d (a tombstone)\n", v.Feed, v.Generation, v.Head, v.Key, v.Seq)
	default:
		doc := v.DocText
		if len(doc) > maxDocShown {
			doc = doc[:maxDocShown] + fmt.Sprintf("… (%d bytes; -o json for all)", len(v.DocText))
		}
		fmt.Fprintf(w, "feed %s (generation %d, head %d): key %q at seq %d\n  %s\n", v.Feed, v.Generation, v.Head, v.Key, v.Seq, doc)
	}
	if v.Unsealed {
		if v.UnsealedDeleted {
			fmt.Fprintln(w, "  a delete of it waits for the sealer (concurrent write mode): no sink sees it yet")
		} else {
			doc := v.UnsealedText
			if len(doc) > maxDocShown {
				doc = doc[:maxDocShown] + fmt.Sprintf("… (%d bytes; -o json for all)", len(v.UnsealedText))
			}
			fmt.Fprintf(w, "  a newer write waits for the sealer (concurrent write mode): no sink sees it yet\n  %s\n", doc)
		}
	}
	if v.Recorded {
		fmt.Fprintln(w, "  a captured change of it waits for the sealer (concurrent write mode), which reads its document from the table: no sink sees it yet")
	}
	if len(v.Sinks) == 0 {
		_, err := fmt.Fprintln(w, "no sinks registered")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SINK\tCURSOR\tSTATE\tWHY")
	for _, s := range v.Sinks {
		why := ""
		switch {
		case s.State == string(pgfeed.KeyPending):
			why = fmt.Sprintf("%d %s ahead of it", s.Ahead, plural(int(s.Ahead), "row", "rows"))
			if s.ParkedSeq > 0 {
				why += fmt.Sprintf("; seq %d was parked: %s", s.ParkedSeq, s.ParkedReason)
			}
		case s.State == string(pgfeed.KeyParked):
			why = s.ParkedReason
		case s.State == string(pgfeed.KeyResyncing):
			why = fmt.Sprintf("filling a fresh copy for generation %d", v.Generation)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Sink, s.Cursor, s.State, why)
	}
	return tw.Flush()
}
