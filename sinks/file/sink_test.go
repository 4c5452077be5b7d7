package file

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// maxDoc is the harness's document bound: above the suite's 1 MiB
// documents, so both the large-document and the over-the-limit subtests run.
const maxDoc = 2 << 20

func newHarness(t *testing.T) feedtest.SinkHarness {
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Path: filepath.Join(dir, "feed.jsonl"), MaxDocumentBytes: maxDoc, CompactMinLines: 50}
	open := func(t *testing.T) feed.Sink {
		s, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	return feedtest.SinkHarness{
		Sink: open(t),
		Contents: func(context.Context) (map[feed.Key]json.RawMessage, error) {
			return Read(opts.Path)
		},
		ConditionalOnSeq: true,
		AtomicPublish:    true,
		MaxDocumentBytes: maxDoc,
		// The directory taken away: every open, create and rename fails.
		Fault: func(t *testing.T) func() {
			if err := os.Rename(dir, dir+".away"); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := os.Rename(dir+".away", dir); err != nil {
					t.Error(err)
				}
			}
		},
		Reopen: open,
	}
}

func TestSinkSuite(t *testing.T) { feedtest.RunSink(t, newHarness) }

func rec(key string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if doc != "" {
		r.Doc = json.RawMessage(doc)
	}
	return r
}

func newSink(t *testing.T, opts Options) *Sink {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "f.jsonl")
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The file is what the package doc says: a header, then one compact line
// per record written, tombstones as deleted lines; stale records write
// nothing.
func TestFileFormat(t *testing.T) {
	s := newSink(t, Options{})
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, "{\n  \"x\": 1\n}"), rec("b", 2, `{"y":"é"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 3, ""), rec("b", 1, `{"stale":true}`)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.opts.Path)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kairos_file":1,"generation":0}
{"key":"a","seq":1,"doc":{"x":1}}
{"key":"b","seq":2,"doc":{"y":"é"}}
{"key":"a","seq":3,"deleted":true}
`
	if string(b) != want {
		t.Fatalf("the file is\n%s\nwant\n%s", b, want)
	}
}

// Two sinks on one file (two processes, as a stale worker and its rival
// would be) racing Apply on the same keys end with the highest seq of each,
// every line whole: the lock makes each Apply's read and append one step.
func TestRacingWritersKeepTheGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.jsonl")
	a, b := newSink(t, Options{Path: path}), newSink(t, Options{Path: path})
	var wg sync.WaitGroup
	for w, s := range []*Sink{a, b} {
		wg.Go(func() {
			for i := range 200 {
				seq := feed.Seq(i*2 + w + 1)
				if _, err := s.Apply(context.Background(), []feed.Record{rec("k", seq, fmt.Sprintf(`{"seq":%d}`, seq)), rec(fmt.Sprintf("w%d", w), seq, `{}`)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	snap, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Seqs["k"] != 400 || string(snap.Docs["k"]) != `{"seq":400}` {
		t.Fatalf("k ended at seq %d with %s; want 400", snap.Seqs["k"], snap.Docs["k"])
	}
	// Lines are in write order; with the guard no line of k goes back.
	data, _ := os.ReadFile(path)
	last := feed.Seq(0)
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n")[1:] {
		var ln line
		if err := json.Unmarshal([]byte(l), &ln); err != nil {
			t.Fatalf("a torn line %q: %v", l, err)
		}
		if ln.Key == "k" {
			if ln.Seq <= last {
				t.Fatalf("k's line at seq %d came after seq %d: the guard let an older write through", ln.Seq, last)
			}
			last = ln.Seq
		}
	}
}

// A line a crashed writer left unfinished is not read, and the next Apply
// drops it before appending, so no line is ever glued to it.
func TestTornLastLine(t *testing.T) {
	s := newSink(t, Options{})
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `{"v":1}`)}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(s.opts.Path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"key":"b","seq":2,"doc":{"v"`)
	f.Close()
	if docs, err := Read(s.opts.Path); err != nil || len(docs) != 1 {
		t.Fatalf("Read with a torn last line = %v, %v", docs, err)
	}
	other := newSink(t, Options{Path: s.opts.Path}) // as a process started after the crash
	if _, err := other.Apply(t.Context(), []feed.Record{rec("b", 2, `{"v":2}`)}); err != nil {
		t.Fatal(err)
	}
	docs, err := Read(s.opts.Path)
	if err != nil || len(docs) != 2 || string(docs["b"]) != `{"v":2}` {
		t.Fatalf("after the torn line = %v, %v", docs, err)
	}
}

// Compaction keeps the live documents and each key's tombstone (so the
// guard still refuses an older write after a delete), one line per key.
func TestCompaction(t *testing.T) {
	s := newSink(t, Options{CompactRatio: 2, CompactMinLines: 10})
	for i := range 20 {
		recs := []feed.Record{rec("a", feed.Seq(3*i+1), fmt.Sprintf(`{"i":%d}`, i)), rec("b", feed.Seq(3*i+2), fmt.Sprintf(`{"i":%d}`, i))}
		if i == 19 {
			recs[1] = rec("b", feed.Seq(3*i+2), "")
		}
		if _, err := s.Apply(t.Context(), recs); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(s.opts.Path)
	if n := strings.Count(string(data), "\n") - 1; n >= 10 {
		t.Fatalf("after 40 writes of 2 keys the file has %d record lines; compaction (at 10) did not run", n)
	}
	if _, err := s.Apply(t.Context(), []feed.Record{rec("b", 3, `{"stale":true}`)}); err != nil {
		t.Fatal(err)
	}
	docs, err := Read(s.opts.Path)
	if err != nil || len(docs) != 1 || string(docs["a"]) != `{"i":19}` {
		t.Fatalf("after compaction = %v, %v; want only a, at its last version", docs, err)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, c := range []struct {
		opts  Options
		field string
	}{
		{Options{}, "options.path"},
		{Options{Path: filepath.Join(t.TempDir(), "missing", "f.jsonl")}, "options.path"},
		{Options{Path: filepath.Join(t.TempDir(), "f"), MaxDocumentBytes: -1}, "options.max_document_bytes"},
		{Options{Path: filepath.Join(t.TempDir(), "f"), CompactRatio: 1}, "options.compact_ratio"},
	} {
		_, err := New(c.opts)
		if inv := (*feed.InvalidError)(nil); err == nil || !asInvalid(err, &inv) || inv.Field != c.field {
			t.Errorf("New(%+v) = %v; want an InvalidError for %s", c.opts, err, c.field)
		}
	}
	p := filepath.Join(t.TempDir(), "notours.jsonl")
	os.WriteFile(p, []byte("hello\n"), 0o644)
	if _, err := New(Options{Path: p}); err == nil || !strings.Contains(err.Error(), "not a kairos file") {
		t.Errorf("New over a file of someone else's = %v", err)
	}
}

// A stale call of an older generation, landing after a resync's copy was
// published, adds no key the copy lacks: the copy's floor refuses it.
func TestStaleGenerationAfterPublish(t *testing.T) {
	s := newSink(t, Options{})
	stale := newSink(t, Options{Path: s.opts.Path}) // the old worker, in another process
	if _, err := stale.Apply(t.Context(), []feed.Record{rec("a", 1, `{"g":1}`), rec("b", 2, `{"g":1}`)}); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Apply(t.Context(), []feed.Record{rec("a", 10, `{"g":2}`)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := stale.Apply(t.Context(), []feed.Record{rec("b", 3, `{"g":1,"late":true}`), rec("c", 4, `{"g":1}`)}); err != nil {
		t.Fatal(err)
	}
	snap, err := Load(s.opts.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Docs) != 1 || string(snap.Docs["a"]) != `{"g":2}` || snap.Generation != 2 {
		t.Fatalf("after a stale call of generation 1 = %v (generation %d); want only a of generation 2", snap.Docs, snap.Generation)
	}
	// Records of the copy's own generation still land.
	if _, err := s.Apply(t.Context(), []feed.Record{rec("b", 11, `{"g":2}`)}); err != nil {
		t.Fatal(err)
	}
	if docs, _ := Read(s.opts.Path); string(docs["b"]) != `{"g":2}` {
		t.Fatalf("a record of generation 2 after the publish: %v", docs)
	}
}
