package syncer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// The environment a rival process is started with.
const (
	childEnv       = "KAIROS_SYNCER_RIVAL" // the process's name; set only in a child
	childSchemaEnv = "KAIROS_SYNCER_RIVAL_SCHEMA"
	childFeedEnv   = "KAIROS_SYNCER_RIVAL_FEED"
)

// The rivals' timings: a short lease so that a killed process's lapses within
// the test, and sink calls well inside its margin.
var (
	rivalLease = feed.LeaseOptions{TTL: 3 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: time.Second}
	rivalSinks = []feed.SinkName{"s1", "s2"}
)

// tableSink is a sink kept in PostgreSQL tables, so that worker processes
// share it as they would share a real one. It applies unconditionally (no
// seq condition) and records, in the same transaction, any key that goes back
// to an older version, and every changing call with whether the store named
// its caller the live lease holder when it began.
type tableSink struct {
	pool   *pgxpool.Pool
	schema string
	proc   string
	id     feed.SinkID
	store  feed.SyncStore
	spy    *leaseSpy
}

func sinkTables(schema string) string {
	q := func(t string) string { return `"` + schema + `".` + t }
	return `
CREATE TABLE ` + q("sink_docs") + ` (sink text, key text, seq bigint NOT NULL, doc jsonb, PRIMARY KEY (sink, key));
CREATE TABLE ` + q("sink_targets") + ` (target text, key text, seq bigint NOT NULL, doc jsonb, PRIMARY KEY (target, key));
CREATE TABLE ` + q("sink_log") + ` (id bigserial PRIMARY KEY, proc text, sink text, holder text, op text, n int, held bool);
CREATE TABLE ` + q("sink_violations") + ` (what text);`
}

func (s *tableSink) t(name string) string { return `"` + s.schema + `".` + name }

// logged runs one changing call in a transaction serialised per sink, so each
// statement sees every earlier call's rows.
func (s *tableSink) logged(ctx context.Context, op string, n int, f func(tx pgx.Tx) error) error {
	holder := s.spy.holder(s.id)
	held := false
	if d, err := s.store.Describe(ctx, s.id.Feed); err == nil {
		for _, st := range d.Sinks {
			held = held || st.Sink == s.id.Sink && st.Lease != nil && st.Lease.Holder == holder && st.Lease.ExpiresAt.After(time.Now())
		}
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, s.schema+"/"+string(s.id.Sink)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.t("sink_log")+` (proc, sink, holder, op, n, held) VALUES ($1, $2, $3, $4, $5, $6)`,
			s.proc, string(s.id.Sink), string(holder), op, n, held); err != nil {
			return err
		}
		return f(tx)
	})
}

// upsert writes recs into table under owner (the sink, or a target id),
// recording regressions first.
func (s *tableSink) upsert(ctx context.Context, tx pgx.Tx, table, ownerCol, owner string, recs []feed.Record) error {
	keys := make([]string, len(recs))
	seqs := make([]int64, len(recs))
	docs := make([]*string, len(recs))
	for i, r := range recs {
		keys[i], seqs[i] = string(r.Key), int64(r.Seq)
		if r.Doc != nil {
			d := string(r.Doc)
			docs[i] = &d
		}
	}
	t := s.t(table)
	_, err := tx.Exec(ctx, `INSERT INTO `+s.t("sink_violations")+` (what)
		SELECT format('%s %s: key %s went back from seq %s to %s', $1::text, $2::text, d.key, d.seq, i.seq)
		FROM unnest($3::text[], $4::bigint[]) AS i(key, seq) JOIN `+t+` d ON d.`+ownerCol+` = $2 AND d.key = i.key
		WHERE d.seq > i.seq`, s.proc, owner, keys, seqs)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+t+` (`+ownerCol+`, key, seq, doc)
		SELECT $1, key, seq, doc::jsonb FROM unnest($2::text[], $3::bigint[], $4::text[]) AS i(key, seq, doc)
		ON CONFLICT (`+ownerCol+`, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc`, owner, keys, seqs, docs)
	return err
}

func (s *tableSink) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	return nil, s.logged(ctx, "apply", len(recs), func(tx pgx.Tx) error {
		return s.upsert(ctx, tx, "sink_docs", "sink", string(s.id.Sink), recs)
	})
}

func (s *tableSink) OpenResync(ctx context.Context, gen feed.Generation) (feed.ResyncTarget, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &tableTarget{s: s, id: s.proc + ":" + hex.EncodeToString(b[:])}, nil
}

type tableTarget struct {
	s  *tableSink
	id string
}

func (t *tableTarget) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	return nil, t.s.logged(ctx, "target-apply", len(recs), func(tx pgx.Tx) error {
		return t.s.upsert(ctx, tx, "sink_targets", "target", t.id, recs)
	})
}

func (t *tableTarget) Publish(ctx context.Context) error {
	s := t.s
	return s.logged(ctx, "publish", 0, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM `+s.t("sink_docs")+` WHERE sink = $1`, string(s.id.Sink)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.t("sink_docs")+` (sink, key, seq, doc) SELECT $1, key, seq, doc FROM `+s.t("sink_targets")+` WHERE target = $2`, string(s.id.Sink), t.id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+s.t("sink_targets")+` WHERE target = $1`, t.id)
		return err
	})
}

func (t *tableTarget) Abort(ctx context.Context) error {
	_, err := t.s.pool.Exec(ctx, `DELETE FROM `+t.s.t("sink_targets")+` WHERE target = $1`, t.id)
	return err
}

// rivalChild is a rival process's main: a runner over the rival sinks until
// SIGTERM, or until its parent goes (its stdin closes).
func rivalChild() int {
	name, schema, f := os.Getenv(childEnv), os.Getenv(childSchemaEnv), feed.FeedName(os.Getenv(childFeedEnv))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, pgtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	store, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, Lease: rivalLease, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer store.Close()
	spy := newSpy(store)
	var targets []syncer.Target
	for _, sink := range rivalSinks {
		id := feed.SinkID{Feed: f, Sink: sink}
		targets = append(targets, syncer.Target{ID: id, Sink: &tableSink{pool: pool, schema: schema, proc: name, id: id, store: store, spy: spy}})
	}
	r, err := syncer.NewRunner(split{store, spy}, targets, syncer.Options{
		BatchSize:    50,
		SinkTimeout:  500 * time.Millisecond,
		LeaseRetry:   200 * time.Millisecond,
		PollInterval: time.Second,
		BackoffMin:   20 * time.Millisecond,
		BackoffMax:   500 * time.Millisecond,
		Logger:       logger,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bytes.Buffer
	done  chan error
}

func startChild(t *testing.T, name, schema string, f feed.FeedName) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+name, childSchemaEnv+"="+schema, childFeedEnv+"="+string(f))
	out := &bytes.Buffer{}
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	cmd.Stdout, cmd.Stderr = w, w
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting rival %s: %v", name, err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, out: out, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("rival %s said:\n%s", name, out.String())
		}
	})
	return c
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRivalProcesses runs the driver in separate processes over the same
// PostgreSQL feed and the same two sinks while the parent writes: one process
// is killed outright (its lease must lapse), one stopped gracefully (its lease
// must be released), one started late. Only the live lease holder ever calls
// a sink, no key goes back to an older version, and both sinks end with the
// feed's live documents.
func TestRivalProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("separate processes: not in -short")
	}
	t.Parallel()
	store, pool, schema := newPG(t, pgfeed.Options{})
	if _, err := pool.Exec(t.Context(), sinkTables(schema)); err != nil {
		t.Fatalf("creating the sink tables: %v", err)
	}
	f := feed.FeedName("rivals")
	ctx := t.Context()
	a := startChild(t, "A", schema, f)
	var b *child
	var c *child
	sent := func(proc string) bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".sink_log WHERE proc = $1`, proc).Scan(&n)
		return err == nil && n > 0
	}
	commit := func(i int) {
		var changes []feed.Change
		for j := range 10 {
			k := feed.Key(fmt.Sprintf("k%03d", (i*7+j*13)%250))
			if (i+j)%6 == 0 {
				changes = append(changes, feed.Delete(k))
			} else {
				changes = append(changes, feed.Put(k, json.RawMessage(fmt.Sprintf(`{"i":%d,"j":%d}`, i, j))))
			}
		}
		if _, err := store.WriteCommitted(ctx, f, changes); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Millisecond)
	}
	// A takes the leases first; B starts as its standby.
	i := 0
	for limit := time.Now().Add(30 * time.Second); !sent("A"); i++ {
		if time.Now().After(limit) {
			t.Fatal("A never sent")
		}
		commit(i)
	}
	b = startChild(t, "B", schema, f)
	for end := i + 50; i < end; i++ {
		commit(i)
	}
	_ = a.cmd.Process.Kill() // no release: its leases must lapse
	// Write on until B has sent (A's leases lapse after the ttl), then start
	// C and stop B gracefully: its leases must be released, not left to lapse.
	for limit := time.Now().Add(30 * time.Second); i < 100 || !sent("B"); i++ {
		if time.Now().After(limit) {
			t.Fatal("B never took over from the killed A")
		}
		commit(i)
	}
	c = startChild(t, "C", schema, f)
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	for end := i + 50; i < end; i++ {
		commit(i)
	}
	select {
	case err := <-b.done:
		b.done <- err
		if err != nil {
			t.Fatalf("rival B did not stop cleanly on SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("rival B did not stop on SIGTERM")
	}

	deadline := time.Now().Add(60 * time.Second)
	caughtUp := func(id feed.SinkID) bool {
		cur, err := store.ReadCursor(ctx, id)
		if err != nil || cur.IsZero() {
			return false
		}
		batch, err := store.ReadBatch(ctx, f, cur.Seq, feed.BatchLimit{Records: 1})
		return err == nil && batch.Generation == cur.Generation && len(batch.Records) == 0
	}
	for _, s := range rivalSinks {
		for !caughtUp(feed.SinkID{Feed: f, Sink: s}) {
			if time.Now().After(deadline) {
				t.Fatalf("sink %s never caught up", s)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-c.done; err != nil {
		t.Fatalf("rival C did not stop cleanly: %v", err)
	}
	c.done <- nil

	var want = map[feed.Key]json.RawMessage{}
	var after feed.Seq
	for {
		batch, err := store.ReadBatch(ctx, f, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range batch.Records {
			if r.Doc != nil {
				want[r.Key] = r.Doc
			} else {
				delete(want, r.Key)
			}
			after = r.Seq
		}
		if len(batch.Records) < 1000 {
			break
		}
	}
	q := func(tbl string) string { return `"` + schema + `".` + tbl }
	for _, s := range rivalSinks {
		rows, err := pool.Query(ctx, `SELECT key, doc FROM `+q("sink_docs")+` WHERE sink = $1 AND doc IS NOT NULL`, string(s))
		if err != nil {
			t.Fatal(err)
		}
		got := map[feed.Key]json.RawMessage{}
		for rows.Next() {
			var k string
			var d []byte
			if err := rows.Scan(&k, &d); err != nil {
				t.Fatal(err)
			}
			got[feed.Key(k)] = d
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		sameDocs(t, "sink "+string(s), got, want)
	}
	rows, err := pool.Query(ctx, `SELECT what FROM `+q("sink_violations"))
	if err != nil {
		t.Fatal(err)
	}
	violations, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(violations) > 0 {
		t.Fatalf("%d regressions, first: %v", len(violations), violations[:min(5, len(violations))])
	}
	var calls, unheld int
	var procs []string
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT held), array_agg(DISTINCT proc) FROM `+q("sink_log")).Scan(&calls, &unheld, &procs); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || unheld != 0 {
		t.Fatalf("%d of %d sink calls made by a process the store did not name the live holder", unheld, calls)
	}
	if !slices.Contains(procs, "A") || !slices.Contains(procs, "B") || !slices.Contains(procs, "C") {
		t.Fatalf("senders %v: the leases never changed hands", procs)
	}
	t.Logf("%d sink calls from %v, none outside a live lease, no regression", calls, procs)
}
