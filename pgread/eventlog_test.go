package pgread_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/internal/pgtest"

	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

func ev(typ, data string) pgread.EventData {
	return pgread.EventData{Type: typ, Data: json.RawMessage(data)}
}

func TestEventLogAppendAndRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	l := e.log
	res, err := l.AppendCommitted(ctx, "cart-1", pgread.NoStream, []pgread.EventData{ev("Created", `{}`), ev("ItemAdded", `{"sku":"a"}`)})
	if err != nil || res != (pgread.AppendResult{Version: 2, First: 1, Last: 2}) {
		t.Fatalf("first append = %+v, %v", res, err)
	}
	// NoStream on an existing stream, and a stale version, both conflict.
	for _, exp := range []pgread.ExpectedVersion{pgread.NoStream, 1, 3} {
		_, err := l.AppendCommitted(ctx, "cart-1", exp, []pgread.EventData{ev("ItemAdded", `{"sku":"b"}`)})
		var vc *pgread.VersionConflictError
		if !errors.Is(err, pgread.ErrVersionConflict) || !errors.As(err, &vc) || vc.Actual != 2 || vc.Expected != exp || vc.Stream != "cart-1" {
			t.Fatalf("append expecting %d: err = %v, want a conflict at 2", exp, err)
		}
	}
	// An expected version on a stream that does not exist conflicts at 0.
	if _, err := l.AppendCommitted(ctx, "cart-2", 1, []pgread.EventData{ev("Created", `{}`)}); !errors.Is(err, pgread.ErrVersionConflict) {
		t.Fatalf("append to a missing stream expecting 1: %v", err)
	}
	res, err = l.AppendCommitted(ctx, "cart-1", 2, []pgread.EventData{ev("ItemAdded", `{"sku":"b"}`)})
	if err != nil || res.Version != 3 || res.First != 3 || res.Last != 3 {
		t.Fatalf("append expecting 2 = %+v, %v", res, err)
	}
	res, err = l.AppendCommitted(ctx, "cart-2", pgread.AnyVersion, []pgread.EventData{ev("Created", `{}`)})
	if err != nil || res.Version != 1 {
		t.Fatalf("AnyVersion on a new stream = %+v, %v", res, err)
	}
	res, err = l.AppendCommitted(ctx, "cart-2", pgread.AnyVersion, []pgread.EventData{ev("Closed", `{"why":"x"}`)})
	if err != nil || res.Version != 2 {
		t.Fatalf("AnyVersion on an existing stream = %+v, %v", res, err)
	}
	// Conflicts took positions in transactions that rolled back; readers see
	// only committed events, in position order.
	all, err := l.ReadAll(ctx, read.Origin, 100)
	mustf(t, err, "ReadAll")
	want := []struct {
		stream  string
		version int64
		typ     string
	}{{"cart-1", 1, "Created"}, {"cart-1", 2, "ItemAdded"}, {"cart-1", 3, "ItemAdded"}, {"cart-2", 1, "Created"}, {"cart-2", 2, "Closed"}}
	if len(all) != len(want) {
		t.Fatalf("ReadAll returned %d events, want %d", len(all), len(want))
	}
	for i, w := range want {
		got := all[i]
		if got.Stream != w.stream || got.Version != w.version || got.Type != w.typ || (i > 0 && got.Position <= all[i-1].Position) || got.RecordedAt.IsZero() {
			t.Fatalf("event %d = %+v, want %+v in ascending positions", i, got, w)
		}
	}
	if string(all[4].Data) != `{"why": "x"}` {
		t.Fatalf("data read back as %s", all[4].Data)
	}
	page, err := l.ReadAll(ctx, all[1].Position, 2)
	mustf(t, err, "ReadAll page")
	if len(page) != 2 || page[0].Position != all[2].Position || page[1].Position != all[3].Position {
		t.Fatalf("page after %d: %+v", all[1].Position, page)
	}
	stream, err := l.ReadStream(ctx, "cart-1", 1, 10)
	mustf(t, err, "ReadStream")
	if len(stream) != 2 || stream[0].Version != 2 || stream[1].Version != 3 {
		t.Fatalf("ReadStream after 1: %+v", stream)
	}
	head, err := l.Head(ctx)
	mustf(t, err, "Head")
	if head < all[4].Position {
		t.Fatalf("head %d below the last event %d", head, all[4].Position)
	}
}

// Appends to one stream expecting the same version race: exactly one lands.
func TestEventLogExpectedVersionRace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = e.log.AppendCommitted(ctx, "acct", pgread.NoStream, []pgread.EventData{ev("Opened", fmt.Sprintf(`{"by":%d}`, i))})
		})
	}
	wg.Wait()
	landed := 0
	for i, err := range errs {
		switch {
		case err == nil:
			landed++
		case !errors.Is(err, pgread.ErrVersionConflict):
			t.Fatalf("appender %d: %v", i, err)
		}
	}
	got, err := e.log.ReadStream(ctx, "acct", 0, 100)
	mustf(t, err, "ReadStream")
	if landed != 1 || len(got) != 1 {
		t.Fatalf("%d appends landed and the stream holds %d events, want 1 and 1", landed, len(got))
	}
}

// Positions are handed out in commit order: a reader tailing the log while
// eight writers append to their own streams (one of them holding its
// transaction open a while) never sees a position it skipped appear later.
func TestEventLogCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 60*time.Second)
	const writers, appends = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range appends {
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if _, err := e.log.Append(ctx, tx, fmt.Sprintf("w%d", w), pgread.ExpectedVersion(2*i), []pgread.EventData{ev("Tick", `{}`), ev("Tock", `{}`)}); err != nil {
						return err
					}
					if w == 0 && i%5 == 0 {
						// Hold the head lock across a pause, so the other
						// writers pile up behind an open transaction.
						_, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`)
						return err
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var seen read.Position
	total := 0
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		batch, err := e.log.ReadAll(ctx, seen, 1000)
		mustf(t, err, "ReadAll")
		for _, ev := range batch {
			if ev.Position != seen+1 {
				t.Fatalf("read position %d right after %d: a position was skipped", ev.Position, seen)
			}
			seen = ev.Position
			total++
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total != writers*appends*2 {
		t.Fatalf("read %d events, want %d", total, writers*appends*2)
	}
}

func TestEventLogBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	big := make([]pgread.EventData, pgread.MaxAppend+1)
	for i := range big {
		big[i] = ev("E", `{}`)
	}
	tx, err := e.pool.Begin(ctx)
	mustf(t, err, "begin")
	defer tx.Rollback(context.Background())
	for _, tc := range []struct {
		name   string
		tx     pgx.Tx
		stream string
		exp    pgread.ExpectedVersion
		events []pgread.EventData
		field  string
	}{
		{"nil tx", nil, "s", 0, []pgread.EventData{ev("E", `{}`)}, "tx"},
		{"empty stream", tx, "", 0, []pgread.EventData{ev("E", `{}`)}, "stream"},
		{"NUL in stream", tx, "a\x00b", 0, []pgread.EventData{ev("E", `{}`)}, "stream"},
		{"expected below AnyVersion", tx, "s", -2, []pgread.EventData{ev("E", `{}`)}, "expected"},
		{"no events", tx, "s", 0, nil, "events"},
		{"too many events", tx, "s", 0, big, "events"},
		{"bad type", tx, "s", 0, []pgread.EventData{ev("E", `{}`), ev("has space", `{}`)}, "events[1].type"},
		{"empty type", tx, "s", 0, []pgread.EventData{ev("", `{}`)}, "events[0].type"},
		{"bad data", tx, "s", 0, []pgread.EventData{ev("E", `{"a":`)}, "events[0].data"},
		{"no data", tx, "s", 0, []pgread.EventData{{Type: "E"}}, "events[0].data"},
		// JSON that jsonb refuses is refused before the append, so the
		// transaction is not aborted and the cases after it still run in it.
		{"data with a lone surrogate", tx, "s", 0, []pgread.EventData{ev("E", `{}`), ev("E", `{"a":"\udc00"}`)}, "events[1].data"},
		{"data in invalid UTF-8", tx, "s", 0, []pgread.EventData{ev("E", "\"\xff\"")}, "events[0].data"},
		{"data out of numeric's range", tx, "s", 0, []pgread.EventData{ev("E", `[1e-16384]`)}, "events[0].data"},
		{"data after them", tx, "s", 0, []pgread.EventData{ev("E", `{"a":`)}, "events[0].data"},
	} {
		_, err := e.log.Append(ctx, tc.tx, tc.stream, tc.exp, tc.events)
		wantField(t, tc.name, err, tc.field)
	}
	_, err = e.log.ReadAll(ctx, -1, 10)
	wantField(t, "ReadAll after", err, "after")
	_, err = e.log.ReadAll(ctx, 0, 0)
	wantField(t, "ReadAll limit", err, "limit")
	_, err = e.log.ReadStream(ctx, "", 0, 10)
	wantField(t, "ReadStream stream", err, "stream")
	_, err = e.log.ReadStream(ctx, "s", -1, 10)
	wantField(t, "ReadStream after", err, "after")
	// Nothing was written by any refusal: the head is still 0.
	mustf(t, tx.Rollback(ctx), "rollback")
	if head, err := e.log.Head(ctx); err != nil || head != 0 {
		t.Fatalf("head %d, %v after refused appends; want 0", head, err)
	}
}

// Reads return events in position (and stream version) order whatever the
// order the table stores them in: here a rolled-back append's space, freed
// by VACUUM, takes the later events in front of the earlier ones, and the
// reads run with index scans off, so only the statements' ORDER BY keeps the
// order.
func TestEventLogReadOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	filler := make([]pgread.EventData, 500)
	for i := range filler {
		filler[i] = ev("Filler", `{"pad":"`+strings.Repeat("x", 200)+`"}`)
	}
	tx, err := e.pool.Begin(ctx)
	mustf(t, err, "begin")
	_, err = e.log.Append(ctx, tx, "filler", pgread.NoStream, filler)
	mustf(t, err, "filler")
	mustf(t, tx.Rollback(ctx), "rollback")
	for i := range 3 {
		_, err := e.log.AppendCommitted(ctx, "s", pgread.ExpectedVersion(i), []pgread.EventData{ev("E", `{}`)})
		mustf(t, err, "append %d", i)
	}
	_, err = e.pool.Exec(ctx, `VACUUM "`+e.schema+`".read_events`)
	mustf(t, err, "vacuum")
	for i := 3; i < 6; i++ {
		_, err := e.log.AppendCommitted(ctx, "s", pgread.ExpectedVersion(i), []pgread.EventData{ev("E", `{}`)})
		mustf(t, err, "append %d", i)
	}
	seqScans := pgtest.PoolWith(t, pgtest.URL(), func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["enable_indexscan"] = "off"
		c.ConnConfig.RuntimeParams["enable_bitmapscan"] = "off"
		c.ConnConfig.RuntimeParams["enable_indexonlyscan"] = "off"
	})
	l := newLog(t, seqScans, e.schema)
	var stored []int64
	mustf(t, pgxCollect(ctx, seqScans, `SELECT version FROM "`+e.schema+`".read_events`, &stored), "stored order")
	if slices.IsSorted(stored) {
		t.Fatalf("the table stores the events in version order (%v): the test's premise, a later event stored first, broke", stored)
	}
	all, err := l.ReadAll(ctx, read.Origin, 100)
	mustf(t, err, "ReadAll")
	stream, err := l.ReadStream(ctx, "s", 0, 100)
	mustf(t, err, "ReadStream")
	for name, got := range map[string][]read.Event{"ReadAll": all, "ReadStream": stream} {
		var versions []int64
		var positions []read.Position
		for _, ev := range got {
			versions, positions = append(versions, ev.Version), append(positions, ev.Position)
		}
		if !slices.Equal(versions, []int64{1, 2, 3, 4, 5, 6}) || !slices.IsSorted(positions) {
			t.Fatalf("%s returned versions %v at positions %v, want 1 to 6 in ascending positions (the table stores versions %v)", name, versions, positions, stored)
		}
	}
}

func pgxCollect(ctx context.Context, db pgread.DBTX, sql string, out *[]int64) error {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return err
	}
	*out, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	return err
}
