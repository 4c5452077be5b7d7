package pgfeed_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// floorEnv is a table captured by key into a feed in the concurrent mode,
// with a sealer (RunSealer) whose rounds take at most limit keys (0: the
// default).
type floorEnv struct {
	capEnv
	f feed.FeedName
}

func newFloorEnv(t *testing.T, limit int) floorEnv {
	t.Helper()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, n int NOT NULL)`)
	e.s = newStore(t, e.d, pgfeed.Options{Sealer: pgfeed.SealerOptions{Limit: limit}})
	e.concurrent = true
	fe := floorEnv{capEnv: e, f: "floor"}
	ctx := t.Context()
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: fe.f, Schema: e.d.schema, Table: "t"}); err != nil {
		t.Fatal(err)
	}
	e.inMode(t, fe.f)
	sealCtx, stop := context.WithCancel(ctx)
	sealed := make(chan error, 1)
	go func() { sealed <- e.s.RunSealer(sealCtx, fe.f) }()
	t.Cleanup(func() { stop(); <-sealed })
	return fe
}

// write has writers goroutines insert one row per transaction, ids from
// first up, until stop is closed; it returns how many rows they inserted.
func (e floorEnv) write(t *testing.T, writers int, first int64, stop <-chan struct{}) func() int64 {
	next := atomic.Int64{}
	next.Store(first)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := next.Add(1) - 1
				if _, err := e.d.pool.Exec(t.Context(), `INSERT INTO `+e.q("t")+` VALUES ($1, 0)`, id); err != nil {
					t.Errorf("insert %d: %v", id, err)
					return
				}
			}
		})
	}
	return func() int64 { wg.Wait(); return next.Load() - first }
}

// lastChange is the highest id the changes table holds for the feed, as
// q (a transaction, or the pool) sees it.
func (e floorEnv) lastChange(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	t.Helper()
	var id int64
	if err := q.QueryRow(t.Context(), `SELECT coalesce(max(id), 0) FROM `+e.q("feed_changes")+` WHERE feed = $1`, string(e.f)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// sealedKey says whether the feed holds key's document, read from the
// feed's rows as they are: nothing here seals.
func (e floorEnv) sealedKey(t *testing.T, key string) bool {
	t.Helper()
	var n int
	if err := e.d.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+e.q("feed_rows")+` WHERE feed = $1 AND key = $2 AND doc IS NOT NULL`, string(e.f), key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// drained waits, sealing nothing itself, until the sealer has sealed every
// recorded change, then checks the feed against the table.
func (e floorEnv) drained(t *testing.T) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := e.unsealed(t, e.f); n == 0 {
			break
		}
		if time.Now().After(end) {
			n, _ := e.unsealed(t, e.f)
			t.Fatalf("30 s after the writers stopped the sealer left %d recorded keys unsealed (floor %d)", n, pgfeed.SealerFloor(e.s, e.f))
		}
	}
	e.same(t, "drained", e.f, e.want(t, `SELECT id::text, to_jsonb(r)::text FROM `+e.q("t")+` AS r`))
}

// floorPatience is how long a test waits for a floor to move while its
// writes go on. A transaction with an xid anywhere in the cluster (another
// test's, held open on purpose) holds every floor back until it ends.
const floorPatience = 20 * time.Second

// floorPasses waits up to d for the sealer's floor to pass id.
func (e floorEnv) floorPasses(t *testing.T, id int64, d time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(d); pgfeed.SealerFloor(e.s, e.f) <= id; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// TestSealerFloorWaitsForOpenWriters: a sealer reads a feed's recorded
// changes from a floor below which none is left and none can come (see
// changesFloor). A writer whose change took a low id and stays open while
// later writers commit and rounds seal theirs must hold the floor at or
// below that id: a floor past it would leave the change unread once its
// writer commits (until the sealer next reads from 0, 10 s on). Once it
// commits, it is sealed as promptly as any, and the floor moves past it.
func TestSealerFloorWaitsForOpenWriters(t *testing.T) {
	t.Parallel()
	e := newFloorEnv(t, 3) // rounds that often leave rows for the next
	ctx := t.Context()
	open, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(ctx) }()
	if _, err := open.Exec(ctx, `INSERT INTO `+e.q("t")+` VALUES (-1, 0)`); err != nil {
		t.Fatal(err)
	}
	held := e.lastChange(t, open)
	stop := make(chan struct{})
	wait := e.write(t, 4, 1, stop)
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if fl := pgfeed.SealerFloor(e.s, e.f); fl > held {
			close(stop)
			wait()
			t.Fatalf("the sealer's floor moved to %d, past the id %d of a change whose writer is open", fl, held)
		}
	}
	if last := e.lastChange(t, e.d.pool); last <= held+100 {
		t.Fatalf("the writers recorded changes up to id %d only, the open one's is %d; the test needs many above it", last, held)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	for !e.sealedKey(t, "-1") {
		if time.Since(committed) > 3*time.Second {
			close(stop)
			wait()
			t.Fatalf("3 s after its writer committed, the change held open is not sealed (floor %d, its id %d)", pgfeed.SealerFloor(e.s, e.f), held)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !e.floorPasses(t, held, floorPatience) {
		close(stop)
		wait()
		t.Fatalf("%v after the open writer committed, with writes going on, the floor is still %d, not past %d", floorPatience, pgfeed.SealerFloor(e.s, e.f), held)
	}
	close(stop)
	if n := wait(); n < 100 {
		t.Fatalf("the writers committed %d rows; the test needs many", n)
	}
	e.drained(t)
}

// TestSealerFloorPastDeadEntries: rows a round deleted leave their index
// entries in the changes table until a VACUUM, and a transaction that holds
// an old snapshot (pg_dump's, a report's) keeps every VACUUM from taking
// them. Such a transaction takes no xid, so it holds no floor back: the
// sealer's probe reads from the floor, over a few index pages, where one
// from 0 reads every entry the writes left.
func TestSealerFloorPastDeadEntries(t *testing.T) {
	t.Parallel()
	e := newFloorEnv(t, 0)
	ctx := t.Context()
	report, err := e.d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = report.Rollback(ctx) }()
	var one int
	if err := report.QueryRow(ctx, `SELECT count(*) FROM `+e.q("t")).Scan(&one); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	wait := e.write(t, 4, 1, stop)
	time.Sleep(2 * time.Second)
	last := e.lastChange(t, e.d.pool)
	passed := e.floorPasses(t, last-50, floorPatience)
	close(stop)
	n := wait()
	if !passed {
		t.Fatalf("%v after %d changes were recorded, with an old snapshot open and writes going on, the floor is %d, not past %d", floorPatience, last, pgfeed.SealerFloor(e.s, e.f), last-50)
	}
	e.drained(t)
	fl := pgfeed.SealerFloor(e.s, e.f)
	buffers := func(floor int64) int {
		var plan []map[string]any
		var raw []byte
		if err := e.d.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+pgfeed.ProbeSQL(e.s), string(e.f), floor).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &plan); err != nil {
			t.Fatal(err)
		}
		p := plan[0]["Plan"].(map[string]any)
		return int(p["Shared Hit Blocks"].(float64) + p["Shared Read Blocks"].(float64))
	}
	from0, fromFloor := buffers(0), buffers(fl)
	t.Logf("%d writes: the probe read %d buffers from 0, %d from the floor %d", n, from0, fromFloor, fl)
	if fromFloor*10 > from0 {
		t.Fatalf("the probe read %d buffers from the floor %d, %d from 0; want a tenth at most", fromFloor, fl, from0)
	}
	// The idle sealer probes every 100 ms: from its floor each reads a page
	// or two, and one every FloorRescan reads from 0. (The server counts a
	// backend's reads when it ends a transaction a second or more after it
	// last did.)
	blocks := func() int64 {
		var n int64
		if err := e.d.pool.QueryRow(ctx, `SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0) + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
			FROM pg_statio_all_tables WHERE relid = $1::regclass`, e.q("feed_changes")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(1500 * time.Millisecond)
	before := blocks()
	time.Sleep(3 * time.Second)
	if read := blocks() - before; read > 3*int64(from0)+500 {
		t.Fatalf("the idle sealer's probes read %d blocks of the changes table in 3 s; from its floor %d they read a few each, and one from 0 (every %v) %d", read, fl, pgfeed.FloorRescan, from0)
	}
}

// TestSealerFloorRounds runs a sealer's rounds one at a time, each taking
// one key, with two writers open while a later one commits: the round
// after they commit takes one of their changes and leaves the other, which
// lies below the highest id sealed before, and the floor must not pass it.
// Once every change is sealed, the floor stands just above the highest
// id, so the next change, whose id comes next, is read too.
func TestSealerFloorRounds(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, n int NOT NULL)`)
	e.s = newStore(t, e.d, pgfeed.Options{Sealer: pgfeed.SealerOptions{Limit: 1}})
	fe := floorEnv{capEnv: e, f: "rounds"}
	ctx := t.Context()
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: fe.f, Schema: e.d.schema, Table: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetWriteMode(ctx, fe.f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	var fl pgfeed.Floor
	round := func(step string) int {
		t.Helper()
		n, err := pgfeed.SealRoundFrom(ctx, e.s, fe.f, &fl)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		return n
	}
	insert := func(q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, id int) {
		t.Helper()
		if _, err := q.Exec(ctx, `INSERT INTO `+e.q("t")+` VALUES ($1, 0)`, id); err != nil {
			t.Fatal(err)
		}
	}
	var open [2]pgx.Tx
	var ids [3]int64
	for i := range open {
		tx, err := e.d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		open[i] = tx
		insert(tx, i+1)
		ids[i] = fe.lastChange(t, tx)
	}
	insert(e.d.pool, 3)
	ids[2] = fe.lastChange(t, e.d.pool)
	if !(ids[0] < ids[1] && ids[1] < ids[2]) {
		t.Fatalf("the changes took ids %v; the test needs them in order", ids)
	}
	if n := round("the round while two writers are open"); n != 1 || !fe.sealedKey(t, "3") {
		t.Fatalf("the round while two writers are open took %d keys; want the committed key 3", n)
	}
	// The floor waits for every transaction that was running at that round
	// to end, those of other tests too: wait for them here, so that the
	// next rounds are the ones that may move it.
	var bound int64
	if err := e.d.pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	for _, tx := range open {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var xmin int64
		if err := e.d.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		if xmin >= bound {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("a transaction of the cluster older than xid %d stayed open a minute", bound)
		}
	}
	round("the first round after they commit")
	if fl.At() > ids[1] {
		t.Fatalf("after a round took one of the two changes committed late, the floor is %d, past the other's id %d", fl.At(), ids[1])
	}
	for i := 0; i < 5 && round("a round") > 0; i++ {
	}
	for _, k := range []string{"1", "2", "3"} {
		if !fe.sealedKey(t, k) {
			t.Fatalf("key %s is not sealed after rounds from the floor (%d) until one took nothing; ids %v", k, fl.At(), ids)
		}
	}
	// More writes, one at a time, each followed by rounds, until the floor
	// has moved past the first three: each write's id is the next one, so
	// a floor set above the highest id sealed, not just past it, would
	// leave one unread.
	extra := 3 // writes after the floor has passed them, whose ids come right above it
	for id := 4; extra > 0; id++ {
		if id > 2000 {
			t.Fatalf("after %d writes, each followed by rounds, the floor is %d, not past %d", id-4, fl.At(), ids[2])
		}
		if fl.At() > ids[2] {
			extra--
		}
		insert(e.d.pool, id)
		for round("a round after a write") > 0 {
		}
		if !fe.sealedKey(t, fmt.Sprint(id)) {
			t.Fatalf("key %d is not sealed after rounds from the floor (%d)", id, fl.At())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
