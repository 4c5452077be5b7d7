package faults_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// watcher samples, every 100ms while a test runs across processes, what the
// store and a target table show, and keeps what breaks an invariant:
//
//   - I5: a sink's holder, once replaced, never shows again, and the
//     feed's generation never goes back;
//   - the cursor never goes back (a fenced move cannot regress it), within a
//     generation or across one;
//   - I2 on the table: a key's seq never goes back between two samples;
//   - a table never serves two generations at once (every document carries
//     the test's generation as "g"), and never an older one after a newer.
type watcher struct {
	e       *env
	pool    *pgxpool.Pool
	table   string // schema-qualified; empty: no table to sample
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	errs    []string
	samples int
	holders map[feed.SinkName][]feed.LeaseHolder // in the order seen
}

func (e *env) watch(pool *pgxpool.Pool, table string) *watcher {
	ctx, cancel := context.WithCancel(e.ctx)
	w := &watcher{e: e, pool: pool, table: table, cancel: cancel, done: make(chan struct{}), holders: map[feed.SinkName][]feed.LeaseHolder{}}
	go w.run(ctx)
	return w
}

func (w *watcher) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 20 {
		w.errs = append(w.errs, fmt.Sprintf(format, args...))
	}
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.done)
	cursors := map[feed.SinkName]feed.Cursor{}
	retired := map[feed.LeaseHolder]bool{}
	current := map[feed.SinkName]feed.LeaseHolder{}
	seqs := map[string]int64{}
	var gen feed.Generation
	topG := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if d, err := w.e.store.Describe(ctx, w.e.feed); err == nil {
			if d.Generation < gen {
				w.fail("I5: the feed's generation went back from %d to %d", gen, d.Generation)
			}
			gen = d.Generation
			for _, s := range d.Sinks {
				if c := cursors[s.Sink]; s.Cursor.Generation < c.Generation || (s.Cursor.Generation == c.Generation && s.Cursor.Seq < c.Seq) {
					w.fail("the cursor of %s went back from %v to %v", s.Sink, c, s.Cursor)
				}
				cursors[s.Sink] = s.Cursor
				var h feed.LeaseHolder
				if s.Lease != nil {
					h = s.Lease.Holder
				}
				if h != current[s.Sink] {
					if current[s.Sink] != "" {
						retired[current[s.Sink]] = true
					}
					if h != "" {
						if retired[h] {
							w.fail("I5: holder %s of %s came back after it was replaced", h, s.Sink)
						}
						w.mu.Lock()
						w.holders[s.Sink] = append(w.holders[s.Sink], h)
						w.mu.Unlock()
					}
					current[s.Sink] = h
				}
			}
		}
		if w.table == "" {
			continue
		}
		rows, _ := w.pool.Query(ctx, `SELECT key, seq, (doc->>'g')::int FROM `+w.table)
		var k string
		var s int64
		var g *int
		gens := map[int]int{}
		_, err := pgx.ForEachRow(rows, []any{&k, &s, &g}, func() error {
			if s < seqs[k] {
				w.fail("I2: %s went back in the table from seq %d to %d", k, seqs[k], s)
			}
			seqs[k] = s
			if g != nil {
				gens[*g]++
			}
			return nil
		})
		if err != nil {
			continue // a restart, a rename under way: the next sample
		}
		w.mu.Lock()
		w.samples++
		w.mu.Unlock()
		if len(gens) > 1 {
			w.fail("a mixed generation in the table: documents of generations %v", gens)
		}
		for g := range gens {
			if g < topG {
				w.fail("the table serves generation %d after it served %d", g, topG)
			}
			topG = max(topG, g)
		}
	}
}

// stop ends the sampling and reports what broke.
func (w *watcher) stop(t testing.TB) {
	t.Helper()
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		t.Error(e)
	}
	if w.table != "" && w.samples == 0 {
		t.Errorf("the watcher never read the table")
	}
}

// checkFileLines is I2 on a file sink from its own bytes: the file is the
// log of every record that reached it, in the order it did, so within each
// copy (after its header) no line may hold a seq for a key below one an
// earlier line held. A generation's documents must also all carry its "g".
func checkFileLines(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("I2: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	seqs := map[feed.Key]feed.Seq{}
	bad := 0
	for n := 1; sc.Scan(); n++ {
		var l struct {
			Key        feed.Key        `json:"key"`
			Seq        feed.Seq        `json:"seq"`
			Doc        json.RawMessage `json:"doc"`
			KairosFile int             `json:"kairos_file"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("line %d of the file: %v", n, err)
			return
		}
		if l.KairosFile != 0 {
			seqs = map[feed.Key]feed.Seq{}
			continue
		}
		if l.Seq < seqs[l.Key] && bad < 10 {
			bad++
			t.Errorf("I2: line %d of the file takes %s back from seq %d to %d", n, l.Key, seqs[l.Key], l.Seq)
		}
		seqs[l.Key] = max(seqs[l.Key], l.Seq)
	}
	if err := sc.Err(); err != nil {
		t.Errorf("reading the file: %v", err)
	}
}

// checkOneGeneration fails t unless every document of docs carries g as
// its "g": a copy never mixes generations.
func checkOneGeneration(t testing.TB, what string, docs map[feed.Key]json.RawMessage, g int) {
	t.Helper()
	other := map[int]int{}
	for _, d := range docs {
		var v struct{ G int }
		_ = json.Unmarshal(d, &v)
		if v.G != g {
			other[v.G]++
		}
	}
	if len(other) > 0 {
		t.Errorf("%s mixes generations: %v documents of other generations than %d", what, other, g)
	}
}
