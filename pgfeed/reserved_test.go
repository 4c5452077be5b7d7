package pgfeed_test

import (
	"context"
	"maps"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// TestReadersStopBelowAReservation is the reader's side of a parallel
// in-place backfill, driven by hand: a transaction has seqs reserved for
// it (the head moved past them, the reservation entered with its id, as
// the backfill's coordinator does), and a writer then commits a row above
// them. Until the transaction commits, a read must stop below the
// reserved seqs, and Head must say so; a reader that went on to the
// writer's row would move its cursor past the reserved seqs and never read
// the row the transaction then commits there. Once it commits, with its
// row and the end of its reservation, both rows read in seq order; a
// reservation whose transaction rolled back holds no reader.
func TestReadersStopBelowAReservation(t *testing.T) {
	t.Parallel()
	e, _ := backfillEnv(t, 0)
	ctx := t.Context()
	write := func(key string) feed.Seq {
		t.Helper()
		r, err := e.s.WriteCommitted(ctx, "t", []feed.Change{feed.Put(feed.Key(key), []byte(`{"k": "`+key+`"}`))})
		if err != nil {
			t.Fatal(err)
		}
		return r.Last
	}
	// reserve opens a transaction, reserves the next seq for it, and
	// returns the transaction and the seq.
	reserve := func() (pgx.Tx, int64) {
		t.Helper()
		tx, err := e.d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		var xid string
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		var seq int64
		if err := e.d.pool.QueryRow(ctx, `WITH g AS (
	UPDATE `+e.q("feed_generations")+` SET head = head + 1 WHERE feed = 't' RETURNING head
), v AS (
	INSERT INTO `+e.q("feed_reserved")+` (feed, first_seq, last_seq, xid) SELECT 't', head, head, $1::text::xid8 FROM g
)
SELECT head FROM g`, xid).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return tx, seq
	}
	// read reads the feed after seq after and returns the keys by seq, and
	// the batch's head; Head must agree with it.
	read := func(after feed.Seq) (map[feed.Seq]string, feed.Seq) {
		t.Helper()
		b, err := e.s.ReadBatch(ctx, "t", after, feed.BatchLimit{Records: 100})
		if err != nil {
			t.Fatal(err)
		}
		h, err := e.s.Head(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		if h != b.Head {
			t.Fatalf("Head = %d, and a batch read just before says %d", h, b.Head)
		}
		got := map[feed.Seq]string{}
		for _, r := range b.Records {
			got[r.Seq] = string(r.Key)
		}
		return got, b.Head
	}
	expect := func(step string, after feed.Seq, want map[feed.Seq]string, head feed.Seq) {
		t.Helper()
		got, h := read(after)
		if !maps.Equal(got, want) || h != head {
			t.Fatalf("%s: read after %d = %v, head %d; want %v, head %d", step, after, got, h, want, head)
		}
	}

	a := write("a")
	tx, r := reserve()
	b := write("b")
	if r != int64(a)+1 || b != a+2 {
		t.Fatalf("seqs a %d, reserved %d, b %d; want three in a row", a, r, b)
	}
	expect("reserved, b committed above", a, map[feed.Seq]string{}, a)
	expect("reserved, from the start", 0, map[feed.Seq]string{a: "a"}, a)
	for _, q := range []string{
		`INSERT INTO ` + e.q("feed_rows") + ` (feed, key, seq, doc) VALUES ('t', 'r', $1, '{}')`,
		`DELETE FROM ` + e.q("feed_reserved") + ` WHERE feed = 't' AND first_seq = $1`,
	} {
		if _, err := tx.Exec(ctx, q, r); err != nil {
			t.Fatal(err)
		}
	}
	expect("reserved row written, not committed", a, map[feed.Seq]string{}, a)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expect("reserved row committed", a, map[feed.Seq]string{feed.Seq(r): "r", b: "b"}, b)

	tx, r = reserve()
	c := write("c")
	expect("reserved again", b, map[feed.Seq]string{}, b)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	expect("reservation rolled back", b, map[feed.Seq]string{c: "c"}, c)
	if r != int64(b)+1 {
		t.Fatalf("reserved %d after b at %d", r, b)
	}
}
