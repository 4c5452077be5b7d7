package bleve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/blevesearch/bleve/v2"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

// harnessMax is the document limit the harness configures, so RunSink
// stores documents of exactly 1 MiB and wants one a byte larger rejected.
const harnessMax = 1 << 20

// harness fills feedtest.SinkHarness on a temporary directory: the pointer
// switch publishes atomically, the seq store guards every write, a reopened
// sink is a second New on the same directory (sharing its open index, as two
// workers of one process do), and there is no Fault (the package doc says
// why).
func harness(t *testing.T) feedtest.SinkHarness {
	dir := t.TempDir()
	opts := kbleve.Options{Dir: dir, MaxDocumentBytes: harnessMax}
	s := newSink(t, opts)
	r := newSearcher(t, dir)
	return feedtest.SinkHarness{
		Sink:             s,
		Contents:         func(ctx context.Context) (map[feed.Key]json.RawMessage, error) { return contents(ctx, r) },
		ConditionalOnSeq: true,
		AtomicPublish:    true,
		MaxDocumentBytes: harnessMax,
		Reopen:           func(t *testing.T) feed.Sink { return newSink(t, opts) },
	}
}

func newSink(t testing.TB, opts kbleve.Options) *kbleve.Sink {
	t.Helper()
	s, err := kbleve.New(t.Context(), opts)
	if err != nil {
		t.Fatalf("bleve.New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the sink: %v", err)
		}
	})
	return s
}

func newSearcher(t testing.TB, dir string) *kbleve.Searcher {
	t.Helper()
	r, err := kbleve.NewSearcher(dir)
	if err != nil {
		t.Fatalf("NewSearcher: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("closing the searcher: %v", err)
		}
	})
	return r
}

// contents reads every live document through the searcher, in one search,
// so one call sees one index.
func contents(ctx context.Context, r *kbleve.Searcher) (map[feed.Key]json.RawMessage, error) {
	req := bleve.NewSearchRequestOptions(bleve.NewMatchAllQuery(), 1<<20, 0, false)
	req.Fields = []string{kbleve.SourceField}
	res, err := r.Search(ctx, req)
	if err != nil {
		return nil, err
	}
	if res.Total != uint64(len(res.Hits)) {
		return nil, fmt.Errorf("the search found %d documents and returned %d", res.Total, len(res.Hits))
	}
	out := make(map[feed.Key]json.RawMessage, len(res.Hits))
	for _, h := range res.Hits {
		src, ok := h.Fields[kbleve.SourceField].(string)
		if !ok {
			return nil, fmt.Errorf("hit %q has no %s (%T)", h.ID, kbleve.SourceField, h.Fields[kbleve.SourceField])
		}
		out[feed.Key(h.ID)] = json.RawMessage(src)
	}
	return out, nil
}

func rec(key string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if doc != "" {
		r.Doc = json.RawMessage(doc)
	}
	return r
}

// applier is a sink or a resync target.
type applier interface {
	Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error)
}

func applyOK(t testing.TB, s applier, records ...feed.Record) {
	t.Helper()
	rej, err := s.Apply(t.Context(), records)
	if err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v; want no rejection and no error", rej, err)
	}
}

func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	switch {
	case err == nil:
		t.Errorf("%s: no error, want one naming %q", what, field)
	case !errors.As(err, &inv):
		t.Errorf("%s: %v (%T), want an *feed.InvalidError", what, err, err)
	case inv.Field != field:
		t.Errorf("%s: the error names %q (%v), want %q", what, inv.Field, err, field)
	}
}
