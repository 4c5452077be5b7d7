package pgfeed_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// tombEnv is one write path of tombstones under test: how it puts and
// deletes a key of feed f, and how its writes enter the feed (the
// concurrent mode's seal).
type tombEnv struct {
	e      capEnv
	f      feed.FeedName
	put    func(t *testing.T, key string)
	delete func(t *testing.T, key string)
}

// dbNow is the database's clock, which stamps tombstones.
func (e capEnv) dbNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	if err := e.d.pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// oldest reads f's oldest tombstone, checking that its age is the
// database's clock minus its time, and that Describe says the same.
func (e capEnv) oldest(t *testing.T, f feed.FeedName) (time.Time, time.Duration) {
	t.Helper()
	before := e.dbNow(t)
	at, age, err := e.s.OldestTombstone(t.Context(), f)
	if err != nil {
		t.Fatalf("OldestTombstone: %v", err)
	}
	after := e.dbNow(t)
	if at.IsZero() {
		if age != 0 {
			t.Fatalf("OldestTombstone = no tombstone with age %v; want 0", age)
		}
	} else if age < before.Sub(at) || age > after.Sub(at) {
		t.Fatalf("OldestTombstone = %v aged %v; want an age between %v and %v (the database's clock)", at, age, before.Sub(at), after.Sub(at))
	}
	d, err := e.s.Describe(t.Context(), f)
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if !d.OldestTombstone.Equal(at) {
		t.Fatalf("Describe's oldest tombstone %v, OldestTombstone's %v", d.OldestTombstone, at)
	}
	return at, age
}

// stamped runs write between two readings of the database's clock, then
// seals (the concurrent mode) between two more, and returns the window the
// tombstone's time must fall in: the write's own transaction in the locked
// mode, the sealing round's in the concurrent mode, which a pause between
// the two keeps apart.
func (te tombEnv) stamped(t *testing.T, write func()) (from, to time.Time) {
	t.Helper()
	from = te.e.dbNow(t)
	write()
	to = te.e.dbNow(t)
	if te.e.concurrent {
		if at, _ := te.e.oldest(t, te.f); !at.IsZero() && !at.Before(from) {
			t.Fatalf("an unsealed delete already counts as a tombstone made at %v", at)
		}
		time.Sleep(150 * time.Millisecond)
		from = te.e.dbNow(t)
		te.e.settle(t, te.f)
		to = te.e.dbNow(t)
	}
	return from, to
}

// wantOldest fails t unless f's oldest tombstone was made within [from, to].
func (te tombEnv) wantOldest(t *testing.T, step string, from, to time.Time) time.Time {
	t.Helper()
	at, _ := te.e.oldest(t, te.f)
	if at.Before(from) || at.After(to) {
		t.Fatalf("%s: oldest tombstone made at %v; want between %v and %v", step, at, from, to)
	}
	return at
}

// wantNone fails t unless f holds no tombstone.
func (te tombEnv) wantNone(t *testing.T, step string) {
	t.Helper()
	if at, age := te.e.oldest(t, te.f); !at.IsZero() {
		t.Fatalf("%s: oldest tombstone made at %v (%v ago); want none", step, at, age)
	}
}

// Every write path that makes a tombstone stamps it with the time of the
// transaction that made it a tombstone of the feed (the write in the locked
// mode, the seal in the concurrent one); a put clears it, a second delete
// stamps it again, RetryParked keeps it, and collection and a reset remove
// it. OldestTombstone and Describe report the oldest.
func TestOldestTombstone(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run("Write/"+string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `COMMENT ON SCHEMA %[1]s IS NULL`)
			e.concurrent = mode == feed.WriteConcurrent
			te := tombEnv{e: e, f: "w"}
			e.inMode(t, te.f)
			write := func(t *testing.T, c feed.Change) {
				t.Helper()
				if _, err := e.s.WriteCommitted(t.Context(), te.f, []feed.Change{c}); err != nil {
					t.Fatal(err)
				}
			}
			te.put = func(t *testing.T, k string) { write(t, feed.Put(feed.Key(k), []byte(`{"k":1}`))) }
			te.delete = func(t *testing.T, k string) { write(t, feed.Delete(feed.Key(k))) }
			tombstoneAges(t, te)
		})
		t.Run("capture/"+string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s.items (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)`)
			e.concurrent = mode == feed.WriteConcurrent
			te := tombEnv{e: e, f: "items"}
			e.inMode(t, te.f)
			if _, err := e.s.Capture(t.Context(), pgfeed.CaptureSpec{Feed: te.f, Schema: e.d.schema, Table: "items"}); err != nil {
				t.Fatal(err)
			}
			te.put = func(t *testing.T, k string) {
				e.exec(t, `INSERT INTO `+e.q("items")+` (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET n = items.n + 1`, k)
			}
			te.delete = func(t *testing.T, k string) { e.exec(t, `DELETE FROM `+e.q("items")+` WHERE id = $1`, k) }
			tombstoneAges(t, te)
		})
	}
}

func tombstoneAges(t *testing.T, te tombEnv) {
	ctx := t.Context()
	e := te.e
	seal := func() { e.settle(t, te.f) }

	te.put(t, "a")
	te.put(t, "b")
	seal()
	te.wantNone(t, "documents only")

	from, to := te.stamped(t, func() { te.delete(t, "a") })
	atA := te.wantOldest(t, "a deleted", from, to)
	_, age1 := e.oldest(t, te.f)
	time.Sleep(50 * time.Millisecond)
	if _, age2 := e.oldest(t, te.f); age2 < age1+40*time.Millisecond {
		t.Fatalf("the oldest tombstone's age went from %v to %v in 50ms; want it to grow", age1, age2)
	}

	// A later tombstone does not change the oldest; the oldest is found
	// whichever key it is.
	te.stamped(t, func() { te.delete(t, "b") })
	if at := te.wantOldest(t, "b deleted too", from, to); !at.Equal(atA) {
		t.Fatalf("oldest moved from %v to %v when a younger tombstone came", atA, at)
	}

	// Putting a back clears its stamp: the oldest is now b's. In the
	// concurrent mode the unsealed put leaves a's tombstone in the feed,
	// and counted, until the seal.
	te.put(t, "a")
	if e.concurrent {
		if at, _ := e.oldest(t, te.f); !at.Equal(atA) {
			t.Fatalf("an unsealed put over a's tombstone moved the oldest from %v to %v", atA, at)
		}
		seal()
	}
	atB, _ := e.oldest(t, te.f)
	if !atB.After(atA) {
		t.Fatalf("after a put over a's tombstone the oldest is %v; want b's, after %v", atB, atA)
	}

	// A parked tombstone retried is the same deletion sent again: it keeps
	// its time although it moves to a new seq.
	e.exec(t, `INSERT INTO `+e.q("feed_parked")+` (feed, sink, key, seq, reason, parked_at)
		SELECT feed, 's', key, seq, 'refused', now() FROM `+e.q("feed_rows")+` WHERE feed = $1 AND key = 'b'`, string(te.f))
	before := e.rowSeq(t, te.f, "b")
	if ok, err := e.s.RetryParked(ctx, feed.SinkID{Feed: te.f, Sink: "s"}, "b"); err != nil || !ok {
		t.Fatalf("RetryParked = %v, %v", ok, err)
	}
	if after := e.rowSeq(t, te.f, "b"); after <= before {
		t.Fatalf("RetryParked left b at seq %d (was %d)", after, before)
	}
	if at, _ := e.oldest(t, te.f); !at.Equal(atB) {
		t.Fatalf("RetryParked moved b's tombstone time from %v to %v", atB, at)
	}

	// Deleting a key whose row is a tombstone already writes a new
	// tombstone at a new seq, stamped anew. (Captured writers cannot:
	// a DELETE finds no row to delete.)
	if te.f == "w" {
		from, to = te.stamped(t, func() { te.delete(t, "b") })
		atB = te.wantOldest(t, "b deleted again", from, to)
	}

	// Held back: a sink's cursor below the tombstone keeps it, and its age
	// grows; once the cursor passes it, collection removes it.
	gen, head := e.head(t, te.f)
	e.exec(t, `INSERT INTO `+e.q("feed_cursors")+` (feed, sink, generation, seq) VALUES ($1, 's', $2, 1)`, string(te.f), int64(gen))
	if n, err := e.s.CollectTombstones(ctx, te.f); err != nil || n != 0 {
		t.Fatalf("CollectTombstones under a cursor at 1 = %d, %v; want 0", n, err)
	}
	if at, _ := e.oldest(t, te.f); !at.Equal(atB) {
		t.Fatalf("a held-back tombstone's time moved from %v to %v", atB, at)
	}
	e.exec(t, `UPDATE `+e.q("feed_cursors")+` SET seq = $2 WHERE feed = $1`, string(te.f), int64(head))
	if n, err := e.s.CollectTombstones(ctx, te.f); err != nil || n != 1 {
		t.Fatalf("CollectTombstones under a cursor at the head = %d, %v; want 1", n, err)
	}
	te.wantNone(t, "collected")

	// A reset empties the feed, tombstones included.
	te.stamped(t, func() { te.delete(t, "a") })
	if at, _ := e.oldest(t, te.f); at.IsZero() {
		t.Fatal("no tombstone after a was deleted again")
	}
	if err := pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		_, err := e.s.ResetTx(ctx, tx, te.f)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	te.wantNone(t, "reset")
}

// rowSeq is key's seq in f.
func (e capEnv) rowSeq(t *testing.T, f feed.FeedName, key string) int64 {
	t.Helper()
	var seq int64
	if err := e.d.pool.QueryRow(t.Context(), `SELECT seq FROM `+e.q("feed_rows")+` WHERE feed = $1 AND key = $2`, string(f), key).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// Migration 4 stamps the tombstones a feed already holds with its own time,
// so they count from the upgrade, and reading the oldest is one probe of
// its index, not a scan of the feed.
func TestOldestTombstoneMigration(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	e := capEnv{d: d, s: newStore(t, d, pgfeed.Options{})}
	const f = feed.FeedName("m")
	changes := []feed.Change{feed.Delete("gone")}
	for i := range 2000 {
		changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("k%04d", i)), []byte(`{}`)))
	}
	if _, err := e.s.WriteCommitted(ctx, f, changes); err != nil {
		t.Fatal(err)
	}
	// As a build before migration 4 left it: no stamp.
	e.exec(t, `UPDATE `+e.q("feed_rows")+` SET deleted_at = NULL`)
	te := tombEnv{e: e, f: f}
	te.wantNone(t, "unstamped")
	ms, err := pgfeed.Migrations(pgfeed.Options{Schema: d.schema})
	if err != nil {
		t.Fatal(err)
	}
	var m4 *pgfeed.Migration
	for i := range ms {
		if ms[i].Version == 4 {
			m4 = &ms[i]
		}
	}
	if m4 == nil {
		t.Fatal("no migration 4")
	}
	from := e.dbNow(t)
	if _, err := d.pool.Exec(ctx, m4.SQL); err != nil {
		t.Fatalf("migration 4 again: %v", err)
	}
	te.wantOldest(t, "after migration 4", from, e.dbNow(t))

	e.exec(t, `ANALYZE `+e.q("feed_rows"))
	rows, err := d.pool.Query(ctx, `EXPLAIN SELECT min(deleted_at) FROM `+e.q("feed_rows")+` WHERE feed = $1 AND doc IS NULL AND seq IS NOT NULL`, string(f))
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "feed_rows_tombstones") {
		t.Fatalf("the oldest tombstone is not read from the tombstones' index:\n%v", lines)
	}
}
