package bleve_test

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/mapping"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := mapping.NewIndexMapping()
	bad.DefaultAnalyzer = "no such analyzer"
	for _, c := range []struct {
		field string
		opts  kbleve.Options
	}{
		{"bleve.dir", kbleve.Options{}},
		{"bleve.max_document_bytes", kbleve.Options{Dir: dir, MaxDocumentBytes: 100}},
		{"bleve.max_document_bytes", kbleve.Options{Dir: dir, MaxDocumentBytes: -1}},
		{"bleve.lock_timeout", kbleve.Options{Dir: dir, LockTimeout: -time.Second}},
		{"bleve.mapping", kbleve.Options{Dir: dir, Mapping: bad}},
	} {
		s, err := kbleve.New(t.Context(), c.opts)
		wantInvalid(t, c.field, err, c.field)
		if s != nil {
			s.Close()
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused options wrote %d entries into the directory", len(entries))
	}
}

// TestBrokenDirectory: a directory the sink cannot trust is an error from
// New, before anything is written, never a fresh index over it.
func TestBrokenDirectory(t *testing.T) {
	t.Parallel()
	t.Run("a file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := kbleve.New(t.Context(), kbleve.Options{Dir: p})
		wantInvalid(t, "New on a file", err, "bleve.dir")
	})
	t.Run("someone else's files", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := kbleve.New(t.Context(), kbleve.Options{Dir: dir})
		wantInvalid(t, "New on a directory of other files", err, "bleve.dir")
		if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
			t.Errorf("the other file is gone: %v", err)
		}
	})
	for name, pointer := range map[string]string{
		"a pointer naming nothing":    "g00000001-0badc0de\n",
		"a pointer of garbage":        "../../etc\n",
		"an empty pointer":            "",
		"a pointer to a broken index": "broken",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if pointer == "broken" {
				s := newSinkNoCleanup(t, kbleve.Options{Dir: dir})
				applyOK(t, s, rec("a", 1, `1`))
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				live := liveDirs(t, dir)[0]
				if err := os.WriteFile(filepath.Join(dir, live, "index", "index_meta.json"), []byte("{not json"), 0o600); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(filepath.Join(dir, "CURRENT"), []byte(pointer), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := kbleve.New(t.Context(), kbleve.Options{Dir: dir})
			if err == nil {
				s.Close()
				t.Fatal("New succeeded")
			}
			t.Logf("New: %v", err)
			if r, err := kbleve.NewSearcher(dir); err == nil {
				r.Close()
				t.Error("NewSearcher succeeded")
			}
		})
	}
	t.Run("no index for a searcher", func(t *testing.T) {
		if r, err := kbleve.NewSearcher(t.TempDir()); err == nil {
			r.Close()
			t.Error("NewSearcher of an empty directory succeeded")
		}
	})
}

func newSinkNoCleanup(t *testing.T, opts kbleve.Options) *kbleve.Sink {
	t.Helper()
	s, err := kbleve.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// liveDirs lists the index directories in dir.
func liveDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestClosed: calls on a closed sink, searcher or resync target are errors,
// never rejections.
func TestClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSinkNoCleanup(t, kbleve.Options{Dir: dir})
	r, err := s.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := kbleve.NewSearcher(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sr.Close(); err != nil {
		t.Fatal(err)
	}
	batch := []feed.Record{rec("a", 1, `1`)}
	if rej, err := s.Apply(t.Context(), batch); !errors.Is(err, kbleve.ErrClosed) || len(rej) != 0 {
		t.Errorf("Apply after Close = %v, %v; want ErrClosed", rej, err)
	}
	if rej, err := r.Apply(t.Context(), batch); !errors.Is(err, kbleve.ErrClosed) || len(rej) != 0 {
		t.Errorf("a resync's Apply after Close = %v, %v; want ErrClosed", rej, err)
	}
	if err := r.Publish(t.Context()); !errors.Is(err, kbleve.ErrClosed) {
		t.Errorf("Publish after Close = %v; want ErrClosed", err)
	}
	if _, err := s.OpenResync(t.Context(), 2); !errors.Is(err, kbleve.ErrClosed) {
		t.Errorf("OpenResync after Close = %v; want ErrClosed", err)
	}
	if _, _, err := sr.Document(t.Context(), "a"); !errors.Is(err, kbleve.ErrClosed) {
		t.Errorf("Document after Close = %v; want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// TestIndexRemovedUnderTheSink: the live index's files deleted while the sink
// has it open make Apply an error (a disk fault, not a record's), and the
// sink rejects nothing.
func TestIndexRemovedUnderTheSink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSink(t, kbleve.Options{Dir: dir})
	applyOK(t, s, rec("a", 1, `{"v":1}`))
	live := liveDirs(t, dir)[0]
	if err := os.RemoveAll(filepath.Join(dir, live)); err != nil {
		t.Fatal(err)
	}
	rej, err := s.Apply(t.Context(), []feed.Record{rec("b", 2, `{"v":2}`), rec("c", 3, `{"v":3}`)})
	if err == nil || len(rej) != 0 {
		t.Fatalf("Apply with the index directory gone = %v, %v; want an error and no rejection", rej, err)
	}
	t.Logf("Apply: %v", err)
}

// TestReopenFromDisk: the documents and the seq guard, tombstones included,
// survive closing the directory and opening it again, as after a restart.
func TestReopenFromDisk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSinkNoCleanup(t, kbleve.Options{Dir: dir})
	applyOK(t, s, rec("a", 5, `"a5"`), rec("b", 6, `"b6"`), rec("gone", 7, `"g7"`))
	applyOK(t, s, rec("gone", 8, ""))
	r, err := s.OpenResync(t.Context(), 1) // left unfinished by the "crash"
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("half", 9, `"h"`))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = newSink(t, kbleve.Options{Dir: dir})
	if got := liveDirs(t, dir); len(got) != 1 {
		t.Errorf("index directories after reopening: %v; want the live one alone (the crashed resync's swept)", got)
	}
	applyOK(t, s, rec("a", 3, `"stale"`), rec("gone", 4, `"stale"`), rec("b", 10, `"b10"`))
	got, err := contents(t.Context(), newSearcher(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	want := map[feed.Key]json.RawMessage{"a": json.RawMessage(`"a5"`), "b": json.RawMessage(`"b10"`)}
	if len(got) != len(want) || !feedtest.JSONEqual(got["a"], want["a"]) || !feedtest.JSONEqual(got["b"], want["b"]) {
		t.Errorf("after reopening and a stale batch: %s; want %s", show(got), show(want))
	}
}

// TestSeqs: a Searcher reads the seq the guard holds per key, a deletion's
// after its document is gone, unmoved by a stale record, and the new copy's
// alone once a resync is published.
func TestSeqs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSink(t, kbleve.Options{Dir: dir})
	sr := newSearcher(t, dir)
	applyOK(t, s, rec("a", 5, `"a5"`), rec("b", 6, `"b6"`), rec("gone", 7, `"g7"`))
	applyOK(t, s, rec("gone", 8, ""), rec("a", 3, `"stale"`))
	got, err := sr.Seqs(t.Context(), "a", "b", "gone", "never")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[feed.Key]feed.Seq{"a": 5, "b": 6, "gone": 8}; !maps.Equal(got, want) {
		t.Errorf("Seqs = %v; want %v", got, want)
	}
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("b", 10, `"b10"`))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	got, err = sr.Seqs(t.Context(), "a", "b", "gone")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[feed.Key]feed.Seq{"b": 10}; !maps.Equal(got, want) {
		t.Errorf("Seqs after a publish = %v; want %v", got, want)
	}
}

func show(m map[feed.Key]json.RawMessage) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// TestSearchAcrossPublish: searches in other goroutines run without a pause
// across publish after publish, never fail, and always see one copy whole;
// an index a search still holds survives its publish until released, then
// goes.
func TestSearchAcrossPublish(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSink(t, kbleve.Options{Dir: dir})
	sr := newSearcher(t, dir)
	const n = 50
	fill := func(target applier, round int) {
		batch := make([]feed.Record, n)
		for i := range batch {
			d, _ := json.Marshal(map[string]any{"round": round, "text": "common words here"})
			batch[i] = feed.Record{Key: feed.Key(string(rune('a'+i%26)) + string(rune('0'+i/26))), Seq: feed.Seq(round*n + i + 1), Doc: d}
		}
		rej, err := target.Apply(t.Context(), batch)
		if err != nil || len(rej) != 0 {
			t.Fatalf("round %d: Apply = %v, %v", round, rej, err)
		}
	}
	fill(s, 0)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var searches int
	var failures []string
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := bleve.NewSearchRequestOptions(bleve.NewMatchQuery("common"), 2*n, 0, false)
				req.Fields = []string{"round"}
				res, err := sr.Search(t.Context(), req)
				mu.Lock()
				searches++
				switch {
				case err != nil:
					failures = append(failures, err.Error())
				case len(res.Hits) != n:
					failures = append(failures, "a search found "+itoa(len(res.Hits))+" documents")
				default:
					rounds := map[any]bool{}
					for _, h := range res.Hits {
						rounds[h.Fields["round"]] = true
					}
					if len(rounds) != 1 {
						failures = append(failures, "a search saw documents of two copies")
					}
				}
				mu.Unlock()
			}
		})
	}
	var held []func()
	var heldNames []string
	for round := 1; round <= 6; round++ {
		if round%2 == 0 { // a search in flight on the copy about to be retired
			name, release, err := kbleve.Hold(sr)
			if err != nil {
				t.Fatal(err)
			}
			held, heldNames = append(held, release), append(heldNames, name)
		}
		r, err := s.OpenResync(t.Context(), feed.Generation(round))
		if err != nil {
			t.Fatal(err)
		}
		fill(r, round)
		if err := r.Publish(t.Context()); err != nil {
			t.Fatalf("round %d: Publish: %v", round, err)
		}
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d searches during publishes failed; the first: %s", len(failures), searches, failures[0])
	}
	t.Logf("%d searches across 6 publishes", searches)

	dirs := liveDirs(t, dir)
	for _, h := range heldNames {
		if !slices.Contains(dirs, h) {
			t.Errorf("index %s was removed while a search held it (directories: %v)", h, dirs)
		}
	}
	if len(dirs) != 1+len(heldNames) {
		t.Errorf("directories %v; want the live one and the %d held ones", dirs, len(heldNames))
	}
	for _, release := range held {
		release()
	}
	if dirs := liveDirs(t, dir); len(dirs) != 1 {
		t.Errorf("directories after the held searches returned: %v; want the live one alone", dirs)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestMapping: the configured mapping is the index's, non-object documents
// are searchable under ValueField, and Document reads a hit back exactly.
func TestMapping(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := bleve.NewIndexMapping()
	dm := bleve.NewDocumentMapping()
	kw := bleve.NewKeywordFieldMapping()
	dm.AddFieldMappingsAt("sku", kw)
	m.DefaultMapping = dm
	s := newSink(t, kbleve.Options{Dir: dir, Mapping: m})
	applyOK(t, s, rec("p1", 1, `{"sku":"AB-12 x","title":"red shoes","n":1e400}`), rec("p2", 2, `"a bare string of words"`))
	sr := newSearcher(t, dir)

	find := func(q string, field string) []string {
		t.Helper()
		var query = bleve.NewTermQuery(q)
		query.SetField(field)
		res, err := sr.Search(t.Context(), bleve.NewSearchRequest(query))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, h := range res.Hits {
			ids = append(ids, h.ID)
		}
		return ids
	}
	if got := find("AB-12 x", "sku"); !slices.Equal(got, []string{"p1"}) {
		t.Errorf("keyword sku: %v; want p1 (the mapping analysed it)", got)
	}
	if got := find("words", kbleve.ValueField); !slices.Equal(got, []string{"p2"}) {
		t.Errorf("the bare string under %s: %v; want p2", kbleve.ValueField, got)
	}
	doc, ok, err := sr.Document(t.Context(), "p1")
	if err != nil || !ok || string(doc) != `{"sku":"AB-12 x","title":"red shoes","n":1e400}` {
		t.Errorf("Document(p1) = %s, %v, %v; want the document byte for byte", doc, ok, err)
	}
	if _, ok, err := sr.Document(t.Context(), "absent"); ok || err != nil {
		t.Errorf("Document(absent) = %v, %v; want not found", ok, err)
	}
}

// TestStaleFromAnEarlierGeneration: after a resync's publish, a stale call
// of the generation before (seqs below everything the resync was sent) is
// ignored even for keys the new copy never had, which no per-key seq covers.
func TestStaleFromAnEarlierGeneration(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSink(t, kbleve.Options{Dir: dir})
	applyOK(t, s, rec("old", 1, `"old"`), rec("both", 2, `"both"`))
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("both", 10, `"new"`), rec("gone", 11, ""))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	applyOK(t, s, rec("old", 3, `"stale"`), rec("never", 4, `"stale"`), rec("gone", 5, `"stale"`), rec("both", 6, ""))
	applyOK(t, s, rec("next", 12, `"next"`))
	got, err := contents(t.Context(), newSearcher(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !feedtest.JSONEqual(got["both"], json.RawMessage(`"new"`)) || !feedtest.JSONEqual(got["next"], json.RawMessage(`"next"`)) {
		t.Errorf("after a stale call of the earlier generation: %s; want both and next alone", show(got))
	}
}
