package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// snapshotPath is one way a change reaches a feed from the application's
// transaction: the store's Write or QueueWrite, LockTx before Write (as
// pgread.WithFeed does), or a captured table's trigger, keyed (no document
// expression: it records keys in the concurrent mode) or with a document
// expression (it writes documents in either mode, through the write
// function). Each path has a feed of its own, named by the path, and the
// captures a table of that name.
type snapshotPath struct {
	name     feed.FeedName
	document string // the capture's document expression; "" and capture: keyed
	capture  bool
	// write writes key id's change in tx; doc is the document it writes.
	write func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (doc string, err error)
}

// storeWrite writes {"id": id} for key id through s.Write.
func storeWrite(ctx context.Context, s *pgfeed.Store, tx pgx.Tx, f feed.FeedName, id int) (string, error) {
	doc := fmt.Sprintf(`{"id": %d}`, id)
	_, err := s.Write(ctx, tx, f, []feed.Change{feed.Put(feed.Key(fmt.Sprint(id)), []byte(doc))})
	return doc, err
}

// captured inserts row id into the path's table, whose trigger writes it.
func captured(ctx context.Context, e capEnv, tx pgx.Tx, table string, id int, doc string) (string, error) {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.q(table)+` (id, name) VALUES ($1, 'row')`, id)
	return doc, err
}

var snapshotPaths = []snapshotPath{
	{name: "write", write: func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (string, error) {
		return storeWrite(ctx, e.s, tx, "write", id)
	}},
	{name: "queued", write: func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (string, error) {
		doc := fmt.Sprintf(`{"id": %d}`, id)
		b := &pgx.Batch{}
		if err := e.s.QueueWrite(b, "queued", []feed.Change{feed.Put(feed.Key(fmt.Sprint(id)), []byte(doc))}, nil); err != nil {
			return doc, err
		}
		return doc, tx.SendBatch(ctx, b).Close()
	}},
	{name: "locktx", write: func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (string, error) {
		if err := e.s.LockTx(ctx, tx, "locktx"); err != nil {
			return "", err
		}
		return storeWrite(ctx, e.s, tx, "locktx", id)
	}},
	{name: "keyed", capture: true, write: func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (string, error) {
		return captured(ctx, e, tx, "keyed", id, fmt.Sprintf(`{"id": %d, "name": "row"}`, id))
	}},
	{name: "documented", capture: true, document: `jsonb_build_object('n', r.id)`, write: func(ctx context.Context, e capEnv, tx pgx.Tx, id int) (string, error) {
		return captured(ctx, e, tx, "documented", id, fmt.Sprintf(`{"n": %d}`, id))
	}},
}

// modeChange is what another transaction does to the feed between the
// writer's snapshot and its write.
type modeChange struct {
	name string
	// from is the feed's mode before the writer's snapshot, with one
	// change written and sealed; "" leaves the feed unwritten and in the
	// default mode.
	from, to feed.WriteMode
	// mustWrite says the writer's transaction has no cause to fail: the
	// feed's mode is the one its snapshot shows, so the write must land.
	mustWrite bool
}

var modeChanges = []modeChange{
	{name: "concurrent to locked", from: feed.WriteConcurrent, to: feed.WriteLocked},
	{name: "locked to concurrent", from: feed.WriteLocked, to: feed.WriteConcurrent},
	{name: "unwritten to concurrent", to: feed.WriteConcurrent},
	// No switch: a sealing round moves the feed's head (the generations
	// row gets a new version) and SetWriteMode sets the mode the feed
	// already has.
	{name: "concurrent, sealed and set again", from: feed.WriteConcurrent, to: feed.WriteConcurrent, mustWrite: true},
}

// TestSnapshotWriterAfterModeSwitch: a writer whose transaction runs in
// REPEATABLE READ or SERIALIZABLE takes its snapshot (a read of the
// application's table) before another transaction switches the feed's
// write mode and commits, and then writes the feed through each path. The
// writer reads the mode from that snapshot, so it may see the mode the
// feed had before the switch. Whatever it does, no change may be stuck:
// the write either fails with a serialization failure (SQLSTATE 40001),
// leaving nothing in the feed or its waiting tables, and the same
// transaction run again lands; or it commits and its change becomes
// readable, in the locked mode at once, in the concurrent mode once
// sealed. (A change written unsealed, or recorded by key, into a feed now
// in the locked mode is never sealed: no sealer runs for that mode.) A
// sealing round or a switch to the mode the feed already has changes no
// mode, and the write must land.
func TestSnapshotWriterAfterModeSwitch(t *testing.T) {
	t.Parallel()
	for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for _, mc := range modeChanges {
			t.Run(string(level)+"/"+mc.name, func(t *testing.T) {
				t.Parallel()
				e := newCapEnv(t, `CREATE TABLE %[1]s.keyed (id int PRIMARY KEY, name text NOT NULL);
					CREATE TABLE %[1]s.documented (id int PRIMARY KEY, name text NOT NULL)`)
				for _, p := range snapshotPaths {
					t.Run(string(p.name), func(t *testing.T) { snapshotWriter(t, e, p, mc, level) })
				}
			})
		}
	}
}

func snapshotWriter(t *testing.T, e capEnv, p snapshotPath, mc modeChange, level pgx.TxIsoLevel) {
	ctx := t.Context()
	f := p.name
	// The switch comes from another store, as from another process; the
	// writer's store keeps the mode it last found.
	other := newStore(t, e.d, pgfeed.Options{})
	if p.capture {
		if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: string(f), Document: p.document}); err != nil {
			t.Fatal(err)
		}
	}
	if mc.from != "" {
		if err := other.SetWriteMode(ctx, f, mc.from); err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
			_, err := p.write(ctx, e, tx, 1)
			return err
		}); err != nil {
			t.Fatalf("the first write, in the %s mode: %v", mc.from, err)
		}
		sealAll(t, e.s, f)
	}

	run := func(id int, between func()) (string, error) {
		tx, err := e.d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		var rows int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+e.q("keyed")).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		between()
		doc, err := p.write(ctx, e, tx, id)
		if err == nil {
			err = tx.Commit(ctx)
		}
		return doc, err
	}
	doc, err := run(2, func() {
		if mc.mustWrite {
			if err := pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
				_, err := p.write(ctx, e, tx, 3)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if n := sealAll(t, other, f); n == 0 {
				t.Fatal("the round after the writer's snapshot sealed nothing")
			}
		}
		if err := other.SetWriteMode(ctx, f, mc.to); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		if mc.mustWrite {
			t.Fatalf("the write failed: %v; want it to land, the feed's mode being the one its snapshot shows", err)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("the write after the switch failed: %v; want it to land, or a serialization failure (40001)", err)
		}
		if mc.from == feed.WriteConcurrent && !strings.Contains(pgErr.Message, "write mode") {
			t.Errorf("the serialization failure says %q; want it to name the write mode's switch", pgErr.Message)
		}
		t.Logf("%s: %v", level, err)
		if n, _ := e.unsealed(t, f); n != 0 {
			t.Fatalf("the failed write left %d changes waiting", n)
		}
		if _, ok := feedDocs(t, e.s, f)["2"]; ok {
			t.Fatal("the failed write's key is in the feed")
		}
		if doc, err = run(2, func() {}); err != nil {
			t.Fatalf("the same transaction run again: %v", err)
		}
	}
	mode, waiting := describeMode(t, e, f)
	if mode != mc.to {
		t.Fatalf("the feed is in the %s mode; want %s", mode, mc.to)
	}
	if mode == feed.WriteConcurrent {
		sealAll(t, e.s, f) // as the feed's sealer would
	} else if waiting != 0 {
		t.Errorf("%d changes wait to be sealed in a feed of the locked mode, where no sealer runs", waiting)
	}
	if got := feedDocs(t, e.s, f)["2"]; got != doc {
		t.Fatalf("key 2 in the feed: %q; want %q", got, doc)
	}
}

// describeMode is f's write mode and its count of writes waiting for a
// seal, as Describe reports them.
func describeMode(t *testing.T, e capEnv, f feed.FeedName) (feed.WriteMode, int64) {
	t.Helper()
	d, err := e.s.Describe(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	return d.Mode, d.Unsealed
}

// TestSnapshotLockTxAfterModeSwitch: LockTx in a REPEATABLE READ
// transaction whose snapshot predates a switch of the feed to the locked
// mode either fails with a serialization failure or takes the locked
// mode's lock (the feed's generations row), as its doc promises: the lock
// a Write of the feed's mode takes first. Taking the concurrent mode's
// shared write lock instead, because the snapshot still shows that mode,
// would leave the transaction without the feed lock it asked for.
func TestSnapshotLockTxAfterModeSwitch(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.keyed (id int PRIMARY KEY, name text NOT NULL)`)
	ctx := t.Context()
	const f = feed.FeedName("locked_later")
	other := newStore(t, e.d, pgfeed.Options{})
	if err := other.SetWriteMode(ctx, f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.WriteCommitted(ctx, f, []feed.Change{feed.Put("1", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	tx, err := e.d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM `+e.q("keyed")); err != nil {
		t.Fatal(err)
	}
	if err := other.SetWriteMode(ctx, f, feed.WriteLocked); err != nil {
		t.Fatal(err)
	}
	err = e.s.LockTx(ctx, tx, f)
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" || !strings.Contains(pgErr.Message, "write mode") {
			t.Fatalf("LockTx after the switch: %v; want it to take the feed lock, or a serialization failure naming the write mode", err)
		}
		return
	}
	_, err = e.d.pool.Exec(ctx, `SELECT FROM `+e.q("feed_generations")+` WHERE feed = $1 FOR UPDATE NOWAIT`, string(f))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("LockTx returned with the feed in the locked mode, but another transaction locks its generations row at once (%v)", err)
	}
}

// TestSetWriteModeWhateverTheSessionDefault: a switch to the locked mode
// from a store whose sessions default to REPEATABLE READ or SERIALIZABLE
// (default_transaction_isolation, as a role or database setting can make
// it) waits for an open concurrent writer and then seals its write, as in
// READ COMMITTED. The switch's first statement takes its snapshot before
// the write lock waits for the writer; a drain that read that snapshot
// would not see the writer's row, and would leave it unsealed in a feed
// of the locked mode.
func TestSetWriteModeWhateverTheSessionDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			ctx := t.Context()
			const f = feed.FeedName("switched")
			w := newStore(t, d, pgfeed.Options{})
			sw := newStore(t, db{pool: defaultingTo(t, level), schema: d.schema}, pgfeed.Options{})
			if err := sw.SetWriteMode(ctx, f, feed.WriteConcurrent); err != nil {
				t.Fatal(err)
			}
			tx, err := d.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(ctx, tx, f, []feed.Change{feed.Put("k", []byte(`{"v": 1}`))}); err != nil {
				t.Fatal(err)
			}
			switched := make(chan error, 1)
			go func() { switched <- sw.SetWriteMode(ctx, f, feed.WriteLocked) }()
			for waiting := false; !waiting; {
				select {
				case err := <-switched:
					t.Fatalf("the switch returned (%v) while a concurrent writer was open", err)
				default:
				}
				if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-switched; err != nil {
				t.Fatalf("SetWriteMode(locked): %v", err)
			}
			desc, err := w.Describe(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if desc.Mode != feed.WriteLocked || desc.Unsealed != 0 {
				t.Fatalf("after the switch: mode %s, %d writes unsealed; want the locked mode and none", desc.Mode, desc.Unsealed)
			}
			if got := feedDocs(t, w, f)["k"]; got != `{"v": 1}` {
				t.Fatalf("key k in the feed: %q; want the writer's document", got)
			}
		})
	}
}

// defaultingTo is a pool whose sessions default to the isolation level
// given (default_transaction_isolation, as a role or a database can set
// it).
func defaultingTo(t *testing.T, level string) *pgxpool.Pool {
	return noticing(t, level, nil)
}

// noticing is defaultingTo, with every notice the server sends its
// sessions (a warning, say) kept in notices when it is not nil.
func noticing(t *testing.T, level string, notices *recorder) *pgxpool.Pool {
	return pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
		if notices != nil {
			cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
				notices.add(n.Severity + ": " + n.Message)
			}
		}
	})
}

// TestSealerWhateverTheSessionDefault: a sealer whose sessions default to
// REPEATABLE READ or SERIALIZABLE (default_transaction_isolation, as a
// role or a database can set it) seals writers that keep rewriting a few
// keys without a fault, as in READ COMMITTED, and so without the pause a
// fault costs. Its rounds run in READ COMMITTED whatever the default: a
// round that read its first statement's snapshot, taken before its lock,
// failed with 40001 on a row a writer had rewritten since. Nor does the
// server warn or notify its sessions of anything, in any of the levels: a
// round that set its level by SET TRANSACTION outside a transaction block
// had PostgreSQL warn at every round, a line in its log each time.
func TestSealerWhateverTheSessionDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			ctx := t.Context()
			const f = feed.FeedName("sealed")
			w := newStore(t, d, pgfeed.Options{})
			concurrentFeed(t, w, f)
			warned, notices := &recorder{}, &recorder{}
			sealer := newStore(t, db{pool: noticing(t, level, notices), schema: d.schema}, pgfeed.Options{Logger: slog.New(warned)})
			sealCtx, stopSealing := context.WithCancel(ctx)
			sealed := make(chan error, 1)
			go func() { sealed <- sealer.RunSealer(sealCtx, f) }()
			var wg sync.WaitGroup
			var commits atomic.Int64
			stop := time.Now().Add(2 * time.Second)
			for i := range 8 {
				wg.Go(func() {
					for n := 0; time.Now().Before(stop); n++ {
						k := feed.Key(fmt.Sprintf("k%d", (i+n)%5))
						v := commits.Add(1)
						err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
							_, err := w.Write(ctx, tx, f, []feed.Change{feed.Put(k, fmt.Appendf(nil, `{"v": %d}`, v))})
							return err
						})
						if err != nil {
							t.Errorf("write: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				desc, err := w.Describe(ctx, f)
				if err != nil {
					t.Fatal(err)
				}
				if desc.Unsealed == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("20 s after the writers stopped %d writes wait unsealed; the sealer warned %q", desc.Unsealed, warned.list())
				}
			}
			stopSealing()
			if err := <-sealed; err != nil {
				t.Fatal(err)
			}
			if got := warned.list(); len(got) > 0 {
				t.Fatalf("the sealer warned %d times over %d commits, first: %s", len(got), commits.Load(), got[0])
			}
			if got := notices.list(); len(got) > 0 {
				t.Fatalf("the server sent the sealer's sessions %d notices over %d commits, first: %s", len(got), commits.Load(), got[0])
			}
			if docs := feedDocs(t, w, f); len(docs) != 5 {
				t.Fatalf("the feed holds %d keys; want the 5 written", len(docs))
			}
		})
	}
}

// TestSnapshotResetAfterWrite: a rebuild whose transaction runs in
// REPEATABLE READ or SERIALIZABLE takes its snapshot, another transaction
// writes a key and commits, and only then does the rebuild reset the feed:
// through ResetTx, or through the TRUNCATE of a captured table (the reset
// function). A reset empties the feed of every write committed before its
// lock, so the late key must not outlive it: either the reset is refused
// (ResetTx's InvalidError, the TRUNCATE's SQLSTATE 25000, or a
// serialization failure), or it commits and the new generation, sealed,
// has no trace of the late key. In the concurrent mode the late write is
// an unsealed row that no lock of the reset meets, and a delete that reads
// the old snapshot leaves it for the sealer to seal into the new
// generation.
func TestSnapshotResetAfterWrite(t *testing.T) {
	t.Parallel()
	for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for _, mode := range []feed.WriteMode{feed.WriteConcurrent, feed.WriteLocked} {
			for _, via := range []string{"ResetTx", "TRUNCATE"} {
				t.Run(fmt.Sprintf("%s/%s/%s", level, mode, via), func(t *testing.T) {
					t.Parallel()
					snapshotReset(t, level, mode, via)
				})
			}
		}
	}
}

func snapshotReset(t *testing.T, level pgx.TxIsoLevel, mode feed.WriteMode, via string) {
	ctx := t.Context()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, name text NOT NULL)`)
	const f = feed.FeedName("t")
	// A document expression: in the concurrent mode the trigger writes
	// unsealed documents, as Write does.
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "t", Document: `jsonb_build_object('n', r.id)`}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetWriteMode(ctx, f, mode); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `INSERT INTO `+e.q("t")+` VALUES (1, 'early')`)
	sealAll(t, e.s, f)
	g0, _ := e.head(t, f)

	tx, err := e.d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+e.q("t")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// The late write: the captured table's trigger for a TRUNCATE, which
	// then removes the row too; Write for ResetTx, whose rebuild writes
	// the documents it wants afterwards.
	if via == "TRUNCATE" {
		e.exec(t, `INSERT INTO `+e.q("t")+` VALUES (2, 'late')`)
	} else if _, err := e.s.WriteCommitted(ctx, f, []feed.Change{feed.Put("2", []byte(`{"n": 2}`))}); err != nil {
		t.Fatal(err)
	}
	if via == "TRUNCATE" {
		_, err = tx.Exec(ctx, `TRUNCATE `+e.q("t"))
	} else {
		_, err = e.s.ResetTx(ctx, tx, f)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		var invalid *feed.InvalidError
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &invalid) && strings.Contains(err.Error(), "needs READ COMMITTED"):
		case errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "25000" && strings.Contains(pgErr.Message, "needs READ COMMITTED")):
		default:
			t.Fatalf("the reset failed: %v; want it to commit, or a refusal saying it needs READ COMMITTED, or a serialization failure", err)
		}
		t.Logf("refused: %v", err)
		if g, _ := e.head(t, f); g != g0 {
			t.Fatalf("the refused reset left the feed at generation %d; want %d", g, g0)
		}
		return
	}
	sealAll(t, e.s, f)
	g, _ := e.head(t, f)
	docs := feedDocs(t, e.s, f)
	if g != g0+1 || len(docs) != 0 {
		t.Fatalf("after the reset the feed is at generation %d with %v; want generation %d, empty: the write committed before the reset's lock outlived it", g, docs, g0+1)
	}
	if n, _ := e.unsealed(t, f); n != 0 {
		t.Fatalf("after the reset %d changes wait to be sealed into the new generation", n)
	}
}
