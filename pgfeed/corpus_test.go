package pgfeed_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// corpus reads the committed seed corpus of one of package feed's fuzz
// targets: each file is "go test fuzz v1" and one Go-quoted value.
func corpus(t *testing.T, target string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "feed", "testdata", "fuzz", target, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no seed corpus for %s: %v", target, err)
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		v := lines[len(lines)-1]
		v = v[strings.IndexByte(v, '(')+1 : strings.LastIndexByte(v, ')')]
		s, err := strconv.Unquote(v)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, s)
	}
	return out
}

// TestFuzzCorporaThroughPostgreSQL sends the seed corpora of package feed's
// fuzz targets through the store: a name or key feed accepts is written and
// read back unchanged, a document feed accepts reads back as equal JSON, and
// whatever feed refuses the store refuses too, before writing anything. The
// fuzz targets hold the same values to the oracle store in their loop.
func TestFuzzCorporaThroughPostgreSQL(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	doc := json.RawMessage(`{"a":1}`)
	for i, name := range corpus(t, "FuzzNames") {
		_, err := s.WriteCommitted(ctx, feed.FeedName(name), []feed.Change{feed.Put("k", doc)})
		if (err == nil) != (feed.FeedName(name).Validate() == nil) {
			t.Fatalf("names[%d] %q: Write = %v, feed's rule disagrees", i, name, err)
		}
		if err == nil {
			if b, err := s.ReadBatch(ctx, feed.FeedName(name), 0, feed.BatchLimit{Records: 10}); err != nil || len(b.Records) != 1 {
				t.Fatalf("names[%d] %q: read back %+v, %v", i, name, b, err)
			}
		}
	}
	for i, key := range corpus(t, "FuzzKey") {
		res, err := s.WriteCommitted(ctx, "keys", []feed.Change{feed.Put(feed.Key(key), doc)})
		if (err == nil) != (feed.Key(key).Validate() == nil) {
			t.Fatalf("keys[%d] %q: Write = %v, feed's rule disagrees", i, key, err)
		}
		if err != nil {
			continue
		}
		b, err := s.ReadBatch(ctx, "keys", res.First-1, feed.BatchLimit{Records: 10})
		if err != nil || len(b.Records) != 1 || string(b.Records[0].Key) != key {
			t.Fatalf("keys[%d] %q: read back %+v, %v", i, key, b.Records, err)
		}
	}
	for i, text := range corpus(t, "FuzzValidateDocument") {
		res, err := s.WriteCommitted(ctx, "docs", []feed.Change{feed.Put("k", json.RawMessage(text))})
		if (err == nil) != (feed.ValidateDocument("doc", json.RawMessage(text)) == nil) {
			t.Fatalf("docs[%d] %q: Write = %v, feed's rule disagrees", i, text, err)
		}
		if err != nil {
			continue
		}
		b, err := s.ReadBatch(ctx, "docs", res.First-1, feed.BatchLimit{Records: 10})
		if err != nil || len(b.Records) != 1 || !feedtest.JSONEqual(b.Records[0].Doc, json.RawMessage(text)) {
			t.Fatalf("docs[%d] %q: read back %+v, %v", i, text, b.Records, err)
		}
	}
}
