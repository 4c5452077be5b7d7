package main

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// TestRunSealsConcurrentFeeds: a feed in the concurrent write mode gets its
// seqs from a sealer, and kairos run is where one runs, for every feed of
// its file, with no setting of its own; without it the writes would wait
// unsealed and no sink would ever see them. A feed that a reload drops has
// its sealer stopped with its workers.
func TestRunSealsConcurrentFeeds(t *testing.T) {
	schema, target := pgtest.Schema(t), pgtest.Schema(t)
	addr := pgtest.ClosedPort(t)
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  schema: %s
http:
  listen: %s
feeds:
  outbox:
    poll_interval: 200ms
    sinks:
      table:
        type: pgtable
        url: %s
        schema: %s
        table: outbox
        create: true
`, pgtest.URL(), schema, addr, pgtest.URL(), target))
	if code, _, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	if _, err := pool.Exec(t.Context(), `CREATE SCHEMA "`+target+`"`); err != nil {
		t.Fatal(err)
	}
	_, st := migratedOn(t, schema)
	if err := st.SetWriteMode(t.Context(), "outbox", feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(ctx, []string{"run", "-c", cfg}, io.Discard, logs) }()

	const writers, each = 8, 25
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range each {
				k := feed.Key(fmt.Sprintf("w%d-%02d", w, i))
				if _, err := st.WriteCommitted(ctx, "outbox", []feed.Change{feed.Put(k, []byte(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)))}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var live int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+target+`".outbox WHERE doc IS NOT NULL`).Scan(&live)
		if err == nil && live == writers*each {
			break
		}
		if time.Now().After(deadline) {
			d, _ := st.Describe(ctx, "outbox")
			t.Fatalf("after 30s the table has %d rows (%v), want %d; the feed: %+v; daemon log:\n%s", live, err, writers*each, d, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	d, err := st.Describe(ctx, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if d.Mode != feed.WriteConcurrent || d.Unsealed != 0 || d.Head != writers*each {
		t.Fatalf("the feed after the daemon sealed it: mode %s, %d unsealed, head %d; want concurrent, 0, %d", d.Mode, d.Unsealed, d.Head, writers*each)
	}
	stopInProcess(t, cancel, done, logs)
	if d, err = st.Describe(t.Context(), "outbox"); err != nil {
		t.Fatal(err)
	}
	if d.Sealer != nil && d.Sealer.Holder != "" {
		t.Fatalf("after a clean stop the sealer's lease is still recorded: %+v", d.Sealer)
	}
}
