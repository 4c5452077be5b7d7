package file_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into a file, whose directory is
// gone for a while after the rebuild. The file ends equal to the feed's live
// documents, of the rebuild's generation, with nothing parked.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const f = feed.FeedName("e2e")
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "e2e.jsonl")
	sink, err := file.New(file.Options{Path: path, CompactMinLines: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{
		Feed: f,
		Sink: "file",
		Seed: 3,
		Fault: func() func() {
			if err := os.Rename(dir, dir+".away"); err != nil { // the disk gone
				t.Fatal(err)
			}
			return func() {
				if err := os.Rename(dir+".away", dir); err != nil {
					t.Fatal(err)
				}
			}
		},
		Options: syncer.Options{BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
	})
	snap, err := file.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Generation != 2 {
		t.Errorf("the file is of generation %d; the rebuild's resync never published", snap.Generation)
	}
	pgtest.CheckDocs(t, "the file", snap.Docs, m.Live)
	t.Logf("%d live documents, %d records applied", len(m.Live), m.State.RecordsApplied)
}
