package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	blevelib "github.com/blevesearch/bleve/v2"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

const (
	defaultDemoURL    = "postgres://postgres@127.0.0.1:5432/postgres"
	defaultDemoSchema = "kairos_demo"
	// demoIndex and demoFile are the sinks' names in the demo's folder; the
	// demo removes these two at its start and nothing else there.
	demoIndex = "search.bleve"
	demoFile  = "orders.jsonl"
)

var discard = slog.New(slog.DiscardHandler)

type demoFlags struct {
	url    string
	memory bool
	dir    string
	events int
	keep   bool
	schema string
}

func (c *cli) demoCmd() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch the whole system work on a small shop's orders",
		Long: `demo writes a few thousand order events to an event log, projects them into
a read model whose feed commits with it, and mirrors that feed into two sinks
that need no server: a bleve search index and a JSON-lines file, both in one
folder (--dir). It shows the sinks catching up, the describe table, a search
and a count against the copies, then rebuilds the projection: the feed moves
to a new generation and every sink fills a fresh copy and swaps it in. It ends
by checking that each sink holds exactly the feed's live documents.

It runs on PostgreSQL (--database-url, or $KAIROS_DATABASE_URL, or the local
server), in a schema of its own, kairos_demo, which it drops and creates again
and drops at the end unless --keep. When no server answers within 2 seconds it
says so and runs the same story in memory.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.events < 1 || f.events > 1_000_000 {
				return usagef("--events must be between 1 and 1000000, got %d", f.events)
			}
			if f.dir == "" {
				return usagef("--dir must name a folder")
			}
			if !cmd.Flags().Changed("database-url") {
				if env := os.Getenv("KAIROS_DATABASE_URL"); env != "" {
					f.url = env
				}
			}
			return redactErr(c.demo(cmd.Context(), f), f.url)
		},
	}
	cmd.Flags().StringVar(&f.url, "database-url", defaultDemoURL, "PostgreSQL to run on (default $KAIROS_DATABASE_URL, or the local server)")
	cmd.Flags().BoolVar(&f.memory, "memory", false, "run in memory without trying PostgreSQL")
	cmd.Flags().StringVar(&f.dir, "dir", "kairos-demo", "folder for the sinks' files, kept after the demo")
	cmd.Flags().IntVar(&f.events, "events", 3000, "how many order events to write")
	cmd.Flags().BoolVar(&f.keep, "keep", false, "keep the schema at the end (PostgreSQL only)")
	cmd.Flags().StringVar(&f.schema, "schema", defaultDemoSchema, "schema to run in, dropped and created again")
	_ = cmd.Flags().MarkHidden("schema") // the tests' own schemas
	return cmd
}

func (c *cli) demo(ctx context.Context, f demoFlags) (err error) {
	out := c.stdout
	term := isTerminal(out)
	dir, err := filepath.Abs(f.dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "kairos demo: the sinks' files go to %s\n", dir)
	if err := prepareDemoDir(dir); err != nil {
		return err
	}

	var db demoBackend
	if !f.memory {
		pg, perr := openPGDemo(ctx, f.url, f.schema, f.keep, 2*time.Second)
		if perr == nil {
			fmt.Fprintf(out, "running on PostgreSQL %s, in schema %s\n", redact(f.url), f.schema)
			db = pg
		} else {
			fmt.Fprintf(out, "no PostgreSQL at %s (%s); running in memory instead\n", redact(f.url), cause(redactErr(perr, f.url)))
		}
	} else {
		fmt.Fprintln(out, "running in memory (--memory)")
	}
	if db == nil {
		db = newMemDemo()
	}
	defer func() {
		if cerr := db.close(context.WithoutCancel(ctx)); err == nil && cerr != nil {
			err = cerr
		}
	}()

	// The two sinks and their workers.
	idx, err := bleve.New(ctx, bleve.Options{Dir: filepath.Join(dir, demoIndex)})
	if err != nil {
		return err
	}
	defer idx.Close()
	jsonl, err := file.New(file.Options{Path: filepath.Join(dir, demoFile)})
	if err != nil {
		return err
	}
	defer jsonl.Close()
	searchID := feed.SinkID{Feed: demoFeed, Sink: "search"}
	fileID := feed.SinkID{Feed: demoFeed, Sink: "file"}
	runner, err := syncer.NewRunner(db.store(), []syncer.Target{{ID: searchID, Sink: idx}, {ID: fileID, Sink: jsonl}}, syncer.Options{
		PollInterval: 200 * time.Millisecond,
		MoveInterval: -1, // every batch moves the cursor, so the bars move smoothly
		Logger:       discard,
	})
	if err != nil {
		return err
	}
	rctx, stopRunner := context.WithCancel(ctx)
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- runner.Run(rctx) }()
	defer func() { stopRunner(); <-runnerDone }()

	// 1. Events, with the projection running beside the writes.
	orders := demoOrders(f.events)
	fmt.Fprintf(out, "\n1. %d order events (%d orders) go to the event log; the projection folds them\n   into one document per order and writes its feed in the same transaction, and\n   the sinks' workers follow the feed as it grows\n", f.events, len(orders))
	proj, err := db.projection(1)
	if err != nil {
		return err
	}
	pctx, stopProj := context.WithCancel(ctx)
	projDone := make(chan error, 1)
	go func() { projDone <- proj.Run(pctx) }()
	stopProjection := func() error {
		stopProj()
		if err := <-projDone; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	bar := newProgress(out, term)
	watch := newSinkWatch(db, runner)
	start, written := time.Now(), 0
	for i := 0; i < len(orders); {
		j := min(i+25, len(orders))
		if err := db.appendOrders(ctx, orders[i:j]); err != nil {
			_ = stopProjection()
			return err
		}
		for _, o := range orders[i:j] {
			written += len(o.events)
		}
		i = j
		lines := []string{bar.line("events", written, f.events, rate(written, start))}
		if bar.due(i == len(orders)) {
			sl, err := watch.lines(ctx, bar)
			if err != nil {
				_ = stopProjection()
				return err
			}
			lines = append(lines, sl...)
		}
		bar.show(i == len(orders), lines...)
	}
	// The background runner may be a poll behind: one CatchUp settles it.
	if _, err := proj.CatchUp(ctx); err != nil {
		_ = stopProjection()
		return err
	}
	if err := stopProjection(); err != nil {
		return err
	}

	fmt.Fprintln(out, "\n2. the sinks' workers catch up with the feed")
	if err := c.watchSinks(ctx, db, runner, term); err != nil {
		return err
	}
	if err := c.showTable(ctx, db, term); err != nil {
		return err
	}
	searcher, err := bleve.NewSearcher(filepath.Join(dir, demoIndex))
	if err != nil {
		return err
	}
	defer searcher.Close()
	if err := c.showQueries(ctx, searcher, filepath.Join(dir, demoFile)); err != nil {
		return err
	}

	// 3. The rebuild.
	fmt.Fprintln(out, "\n3. version 2 of the projection counts items: the projection is rebuilt, the feed\n   moves to a new generation, and each sink fills a fresh copy and swaps it in")
	gen, err := db.rebuild(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   the feed is at generation %d; replaying the log\n", gen)
	proj2, err := db.projection(2)
	if err != nil {
		return err
	}
	replayed, err := proj2.CatchUp(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   replayed %d events\n", replayed)
	if err := c.watchSinks(ctx, db, runner, term); err != nil {
		return err
	}
	live, err := verifyDemo(ctx, db.store(), searcher, filepath.Join(dir, demoFile))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nverified: the index and the file each hold exactly the feed's %d live documents\n", live)
	if err := c.showTable(ctx, db, term); err != nil {
		return err
	}
	if err := c.showQueries(ctx, searcher, filepath.Join(dir, demoFile)); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe sinks' files stay in %s\n", dir)
	if pg, ok := db.(*pgDemo); ok {
		if f.keep {
			fmt.Fprintf(out, "schema %s kept (--keep)\n", pg.schema)
		} else {
			fmt.Fprintf(out, "schema %s dropped (--keep keeps it)\n", pg.schema)
		}
	}
	return nil
}

// prepareDemoDir creates the folder and removes what an earlier demo left
// in it: its feed started over, so an old copy would hold higher seqs than
// the new feed's and refuse them.
func prepareDemoDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(dir, demoIndex)); err != nil {
		return err
	}
	matches, err := filepath.Glob(filepath.Join(dir, demoFile+"*"))
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			return err
		}
	}
	return nil
}

// sinkWatch makes a bar per sink: the cursor's seq against the head, or,
// while a sink resyncs (its cursor in the generation before), the records
// sent since the watch began.
type sinkWatch struct {
	db     demoBackend
	runner *syncer.Runner
	sent0  map[feed.SinkName]int64
}

func newSinkWatch(db demoBackend, runner *syncer.Runner) *sinkWatch {
	w := &sinkWatch{db: db, runner: runner, sent0: map[feed.SinkName]int64{}}
	for _, s := range runner.States() {
		w.sent0[s.ID.Sink] = s.RecordsSent
	}
	return w
}

func (w *sinkWatch) lines(ctx context.Context, bar *progress) ([]string, error) {
	// Seqs run on across generations: the bars count from the seq before
	// the generation's first record.
	first, err := w.db.store().ReadBatch(ctx, demoFeed, 0, feed.BatchLimit{Records: 1})
	if err != nil {
		return nil, err
	}
	var base feed.Seq
	if len(first.Records) > 0 {
		base = first.Records[0].Seq - 1
	}
	gen, head := first.Generation, first.Head
	var lines []string
	for _, s := range w.runner.States() {
		name := string(s.ID.Sink)
		switch {
		case s.Cursor.Generation == gen:
			lines = append(lines, bar.line(name, int(max(s.Cursor.Seq-base, 0)), int(head-base), fmt.Sprintf("cursor %d/%d", s.Cursor.Generation, s.Cursor.Seq)))
		default:
			sent := int(s.RecordsSent - w.sent0[s.ID.Sink])
			lines = append(lines, bar.line(name, min(sent, int(head-base)), int(head-base), "resyncing into a fresh copy"))
		}
	}
	return lines, nil
}

// watchSinks redraws the sinks' bars until every worker has applied the
// whole feed.
func (c *cli) watchSinks(ctx context.Context, db demoBackend, runner *syncer.Runner, term bool) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := runner.WaitCaughtUp(wctx); done <- err }()
	watch := newSinkWatch(db, runner)
	bar := newProgress(c.stdout, term)
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var err error
		finished := false
		select {
		case err = <-done:
			finished = true
		case <-tick.C:
		}
		if err != nil {
			return err
		}
		lines, err := watch.lines(ctx, bar)
		if err != nil {
			return err
		}
		bar.show(finished, lines...)
		if finished {
			fmt.Fprintf(c.stdout, "   caught up in %v\n", time.Since(start).Round(10*time.Millisecond))
			return nil
		}
	}
}

func (c *cli) showTable(ctx context.Context, db demoBackend, term bool) error {
	views, err := db.describe(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, "\n$ kairos describe orders")
	return render(c.stdout, "table", views, term)
}

// showQueries asks the two copies a question each: the index, every order
// of one customer; the file, how many orders it holds and how many shipped.
func (c *cli) showQueries(ctx context.Context, s *bleve.Searcher, path string) error {
	out := c.stdout
	q := blevelib.NewMatchQuery("grace")
	q.SetField("customer")
	req := blevelib.NewSearchRequestOptions(q, 3, 0, false)
	req.Fields = []string{bleve.SourceField}
	req.SortBy([]string{"_id"})
	res, err := s.Search(ctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nsearch the index for customer:grace → %d hits; the first %d:\n", res.Total, len(res.Hits))
	for _, h := range res.Hits {
		src, _ := h.Fields[bleve.SourceField].(string)
		var o order
		if err := json.Unmarshal([]byte(src), &o); err != nil {
			return fmt.Errorf("hit %s: %w", h.ID, err)
		}
		items := fmt.Sprintf("%d %s", len(o.Items), plural(len(o.Items), "line", "lines"))
		if o.ItemCount > 0 {
			items += fmt.Sprintf(", %d %s", o.ItemCount, plural(o.ItemCount, "item", "items"))
		}
		fmt.Fprintf(out, "   %s  %-8s %-8s %8.2f  %s\n", h.ID, o.Customer, o.Status, float64(o.TotalCents)/100, items)
	}
	snap, err := file.Load(path)
	if err != nil {
		return err
	}
	shipped := 0
	for _, doc := range snap.Docs {
		var o order
		if json.Unmarshal(doc, &o) == nil && o.Status == "shipped" {
			shipped++
		}
	}
	fmt.Fprintf(out, "count the file (%s, generation %d) → %d orders, %d shipped\n", filepath.Base(path), snap.Generation, len(snap.Docs), shipped)
	return nil
}

// verifyDemo checks that the index and the file each hold exactly the
// feed's live documents, and returns how many there are.
func verifyDemo(ctx context.Context, st feed.Reader, s *bleve.Searcher, path string) (int, error) {
	live, err := liveDocs(ctx, st, demoFeed)
	if err != nil {
		return 0, err
	}
	snap, err := file.Load(path)
	if err != nil {
		return 0, err
	}
	if err := sameDocs("the file", live, snap.Docs); err != nil {
		return 0, err
	}
	n, err := s.DocCount()
	if err != nil {
		return 0, err
	}
	if int(n) != len(live) {
		return 0, fmt.Errorf("the index holds %d documents, the feed %d", n, len(live))
	}
	for k, want := range live {
		got, ok, err := s.Document(ctx, k)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("the index has no document for %s", k)
		}
		if !sameJSON(got, want) {
			return 0, fmt.Errorf("the index holds %s for %s, the feed %s", got, k, want)
		}
	}
	return len(live), nil
}

// liveDocs reads the whole feed: its documents by key, tombstones left out.
func liveDocs(ctx context.Context, st feed.Reader, f feed.FeedName) (map[feed.Key]json.RawMessage, error) {
	docs := map[feed.Key]json.RawMessage{}
	var after feed.Seq
	for {
		b, err := st.ReadBatch(ctx, f, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			return nil, err
		}
		for _, r := range b.Records {
			if r.Deleted() {
				delete(docs, r.Key)
			} else {
				docs[r.Key] = append(json.RawMessage(nil), r.Doc...)
			}
			after = r.Seq
		}
		if !b.More {
			return docs, nil
		}
	}
}

func sameDocs(what string, want, got map[feed.Key]json.RawMessage) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s holds %d documents, the feed %d", what, len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			return fmt.Errorf("%s has no document for %s", what, k)
		}
		if !sameJSON(g, w) {
			return fmt.Errorf("%s holds %s for %s, the feed %s", what, g, k, w)
		}
	}
	return nil
}

// sameJSON compares documents as values: PostgreSQL hands a jsonb document
// out with its own spacing, and the file compacts it onto one line.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// redact is a connection string fit to print: its password masked, and a
// key=value string, which cannot be masked reliably, not shown at all.
func redact(conn string) string {
	u, err := url.Parse(conn)
	if err != nil || u.Scheme == "" {
		return "the configured database"
	}
	return u.Redacted()
}

// cause is the innermost of err's causes, on one line: "connection
// refused" rather than pgx's account of every address it tried.
func cause(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for e := err; e != nil; {
		msg = e.Error()
		if j, ok := e.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 0 {
			e = j.Unwrap()[0] // pgx tries each address and TLS mode; the first says it
			continue
		}
		e = errors.Unwrap(e)
	}
	return strings.Join(strings.Fields(msg), " ")
}

func rate(n int, since time.Time) string {
	sec := time.Since(since).Seconds()
	if sec <= 0 {
		return ""
	}
	return fmt.Sprintf("%.0f/s", float64(n)/sec)
}

// progress draws bars: on a terminal, redrawn in place; elsewhere (a pipe,
// a file, a test's buffer), a plain line per bar about once a second and at
// the end, so a log holds a few lines, not a line per batch.
type progress struct {
	w     io.Writer
	term  bool
	drawn int
	last  time.Time
}

func newProgress(w io.Writer, term bool) *progress { return &progress{w: w, term: term} }

func (p *progress) line(name string, n, total int, note string) string {
	const width = 30
	frac := 1.0
	if total > 0 {
		frac = min(1, float64(n)/float64(total))
	}
	full := int(frac * width)
	return fmt.Sprintf("   %-7s [%s%s] %7d/%-7d %3.0f%%  %s", name, strings.Repeat("#", full), strings.Repeat(".", width-full), n, total, frac*100, note)
}

// due says whether show would draw now.
func (p *progress) due(final bool) bool {
	switch {
	case final:
		return true
	case p.term:
		return time.Since(p.last) >= 100*time.Millisecond
	}
	return !p.last.IsZero() && time.Since(p.last) >= time.Second
}

func (p *progress) show(final bool, lines ...string) {
	if p.term {
		if !p.due(final) {
			return
		}
		p.last = time.Now()
		if p.drawn > 0 {
			fmt.Fprintf(p.w, "\x1b[%dA", p.drawn)
		}
		for _, l := range lines {
			fmt.Fprintf(p.w, "\r\x1b[K%s\n", l)
		}
		p.drawn = len(lines)
		return
	}
	if !final && time.Since(p.last) < time.Second {
		return
	}
	if p.last.IsZero() && !final {
		p.last = time.Now() // the first second draws nothing: short runs print only the end
		return
	}
	p.last = time.Now()
	for _, l := range lines {
		fmt.Fprintln(p.w, l)
	}
}
