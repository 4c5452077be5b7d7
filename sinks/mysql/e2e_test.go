package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// recording is the sink as the end-to-end test runs it: it counts the
// errors the worker saw, and puts the history triggers on every shadow
// table a resync opens, so that every row write the target ever took, live
// or shadow, lands in the history table.
type recording struct {
	*Sink
	t      *testing.T
	admin  *sql.DB
	hist   string
	errs   atomic.Int64
	opened atomic.Int64
}

func (r *recording) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	rej, err := r.Sink.Apply(ctx, records)
	if err != nil {
		r.errs.Add(1)
	}
	return rej, err
}

func (r *recording) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	target, err := r.Sink.OpenResync(ctx, g)
	if err != nil {
		r.errs.Add(1)
		return nil, err
	}
	shadow := target.(*resync).shadow
	if err := historyTriggers(ctx, r.admin, shadow, r.hist); err != nil {
		_ = target.Abort(ctx)
		return nil, fmt.Errorf("test: triggers on %s: %w", shadow, err)
	}
	r.opened.Add(1)
	return target, nil
}

// historyTriggers records every row table takes (an insert, or an update
// by the upsert's ON DUPLICATE KEY branch, guarded or not) as (key, seq)
// in hist, in the order the server applied them.
func historyTriggers(ctx context.Context, db *sql.DB, table, hist string) error {
	for _, ev := range []string{"INSERT", "UPDATE"} {
		if _, err := db.ExecContext(ctx, "CREATE TRIGGER `"+table+"_"+ev[:1]+"` AFTER "+ev+" ON `"+table+
			"` FOR EACH ROW INSERT INTO `"+hist+"` (`k`, `s`) VALUES (NEW.`key`, NEW.`seq`)"); err != nil {
			return err
		}
	}
	return nil
}

// TestEndToEnd runs pgfeed → syncer.Runner → this sink: 10,000 changes with
// deletes, a rebuild (generation bump) half way, and the sink's server
// unreachable for a while in the middle. At the end the table serves
// exactly the feed's live documents, and the history the triggers kept
// shows no key ever going back to an older seq.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 changes through the driver: not in -short")
	}
	t.Parallel()
	ctx := t.Context()
	admin := adminDB(t)
	table := tableName(t, admin)
	hist := tableName(t, admin)
	if _, err := admin.ExecContext(ctx, "CREATE TABLE `"+hist+"` (`id` BIGINT AUTO_INCREMENT PRIMARY KEY, `k` VARBINARY(512) NOT NULL, `s` BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	s, link := openSink(t, table, true)
	if err := historyTriggers(ctx, admin, table, hist); err != nil {
		t.Fatal(err)
	}
	sink := &recording{Sink: s, t: t, admin: admin, hist: hist}

	store, pool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	h := pgtest.Harness(store, pool)
	id := feed.SinkID{Feed: "orders", Sink: "mysql"}
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{
		BatchSize: 250, PollInterval: 200 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = runner.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })

	const txs, perTx, keys = 500, 20, 700
	n := 0
	var restore func()
	for i := range txs {
		changes := make([]feed.Change, 0, perTx)
		seen := map[int]bool{}
		for range perTx {
			k := (n * 7919) % keys
			n++
			if seen[k] {
				continue
			}
			seen[k] = true
			if n%5 == 0 {
				changes = append(changes, feed.Delete(feed.Key(fmt.Sprintf("order/%d ü", k))))
			} else {
				changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("order/%d ü", k)), []byte(fmt.Sprintf(`{"n":%d,"tx":%d,"pad":"%0100d"}`, n, i, n))))
			}
		}
		if _, err := h.Write(ctx, id.Feed, changes); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		switch i {
		case txs / 2:
			if _, err := h.Rebuild(ctx, id.Feed); err != nil {
				t.Fatalf("rebuild: %v", err)
			}
		case txs/2 + 50:
			restore = link.Down()
		case txs/2 + 100:
			// The outage must have been seen before it ends.
			deadline := time.Now().Add(20 * time.Second)
			for sink.errs.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			restore()
		}
		if i > txs/2+50 && i < txs/2+100 {
			time.Sleep(5 * time.Millisecond) // the outage lasts a while
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := runner.WaitCaughtUp(waitCtx); err != nil {
		t.Fatalf("WaitCaughtUp: %v (state %+v)", err, runner.States()[0])
	}
	if sink.errs.Load() == 0 {
		t.Fatal("the sink never failed during the outage: the test proves nothing")
	}
	if sink.opened.Load() < 2 {
		t.Fatalf("%d resyncs opened; want the first one and the rebuild's", sink.opened.Load())
	}

	// The table serves exactly the feed's live documents.
	b, err := store.ReadBatch(ctx, id.Feed, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 {
		t.Fatalf("the feed is at generation %d, want 2", b.Generation)
	}
	want := map[feed.Key][]byte{}
	for _, r := range b.Records {
		if r.Doc != nil {
			want[r.Key] = r.Doc
		}
	}
	// A worker that lost its lease may still land one late call: older
	// versions of keys the table holds. The guard must ignore it.
	var stale []feed.Record
	for _, r := range b.Records[:100] {
		stale = append(stale, feed.Record{Key: r.Key, Seq: r.Seq - 1, Doc: []byte(`{"stale":true}`)})
	}
	if rej, err := s.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("a stale call: %v, %v", rej, err)
	}
	got, err := contents(ctx, admin, table)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("the table serves %d documents, the feed has %d live", len(got), len(want))
	}
	for k, d := range want {
		if !feedtest.JSONEqual(got[k], d) {
			t.Errorf("%q: the table serves %.80s, the feed has %.80s", k, got[k], d)
		}
	}

	// No key ever went back.
	rows, err := admin.QueryContext(ctx, "SELECT `k`, `s` FROM `"+hist+"` ORDER BY `id`")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int64{}
	writes, back := 0, 0
	for rows.Next() {
		var k []byte
		var s int64
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		writes++
		if s < last[string(k)] {
			back++
			if back <= 5 {
				t.Errorf("%q went back from seq %d to %d", k, last[string(k)], s)
			}
		}
		last[string(k)] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if writes < txs*perTx/2 {
		t.Errorf("the history holds %d writes; the triggers missed some", writes)
	}
	st := runner.States()[0]
	t.Logf("%d writes recorded, %d live documents, %d sink errors, %d resyncs, %d sent; last error: %v", writes, len(want), sink.errs.Load(), sink.opened.Load(), st.RecordsSent, st.LastError)
}
