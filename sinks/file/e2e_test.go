package file_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd runs pgfeed → syncer.Runner → file: 10k changes with
// deletes, a rebuild mid-stream and the file's directory gone for a while.
// The file ends equal to the feed's live documents, of the rebuild's
// generation, with nothing parked.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	store, pool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	h := pgtest.Harness(store, pool)
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
	quiet := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: feed.SinkID{Feed: f, Sink: "file"}, Sink: sink}},
		syncer.Options{BatchSize: 500, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PollInterval: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = runner.Run(rctx) }()
	defer func() { stop(); <-done }()

	rnd := rand.New(rand.NewPCG(3, 4))
	const writes, per = 100, 100
	for i := range writes {
		switch i {
		case 40:
			if _, err := h.Rebuild(ctx, f); err != nil {
				t.Fatal(err)
			}
		case 60:
			if err := os.Rename(dir, dir+".away"); err != nil { // the disk gone
				t.Fatal(err)
			}
		case 75:
			if err := os.Rename(dir+".away", dir); err != nil {
				t.Fatal(err)
			}
		}
		changes := make([]feed.Change, 0, per)
		for j := range per {
			k := feed.Key(fmt.Sprintf("key-%d", rnd.IntN(2000)))
			if rnd.IntN(5) == 0 {
				changes = append(changes, feed.Delete(k))
			} else {
				changes = append(changes, feed.Put(k, []byte(fmt.Sprintf(`{"w":%d,"j":%d}`, i, j))))
			}
		}
		if _, err := h.Write(ctx, f, changes); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := runner.WaitCaughtUp(wctx); err != nil {
		t.Fatalf("WaitCaughtUp: %v (state %+v)", err, runner.States())
	}
	want := map[feed.Key][]byte{}
	for after := feed.Seq(0); ; {
		b, err := store.ReadBatch(ctx, f, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range b.Records {
			if r.Doc != nil {
				want[r.Key] = r.Doc
			}
			after = r.Seq
		}
		if !b.More {
			break
		}
	}
	if parked, err := store.ReadParked(ctx, feed.SinkID{Feed: f, Sink: "file"}); err != nil || len(parked) != 0 {
		t.Errorf("%d parked, %v; nothing may be parked", len(parked), err)
	}
	snap, err := file.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Generation != 2 {
		t.Errorf("the file is of generation %d; the rebuild's resync never published", snap.Generation)
	}
	if len(snap.Docs) != len(want) {
		t.Errorf("the file holds %d documents, the feed %d", len(snap.Docs), len(want))
	}
	for k, d := range want {
		if !feedtest.JSONEqual(snap.Docs[k], d) {
			t.Errorf("%s: the file holds %s, the feed %s", k, snap.Docs[k], d)
		}
	}
	st := runner.States()[0]
	if st.LastError == nil {
		t.Errorf("the worker never met the directory's absence")
	}
	t.Logf("%d live documents, %d records applied, last fault: %v", len(want), st.RecordsApplied, st.LastError)
}
