package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Deferred sealing (issue 13), measured before it is built into pgfeed: a
// writer takes no feed lock and sends no notify; it upserts its key's row
// *unsealed*, and one sealer per feed, in short rounds under the feed lock,
// gives the unsealed rows fresh seqs from the head.
//
// The rows table of the experiment is pgfeed's with three changes:
//
//   - seq is nullable. A key written for the first time has no seq until it
//     is sealed. NULL keeps UNIQUE (feed, seq) as it is (NULLs are distinct)
//     and keeps the key out of the reader's `seq > $after ORDER BY seq` scan
//     with no change to it, where a placeholder seq (0, or a negative one per
//     key) would need a relaxed CHECK and a reader that skips it.
//   - pending and pending_doc hold the unsealed write: pending says one is
//     waiting, pending_doc is its document (NULL: a delete). The sealed seq
//     and doc stay readable beside them until the sealer replaces them, so a
//     reader of sealed rows never sees an unsealed document.
//   - a partial index on (feed, key) WHERE pending: the sealer's probe and its
//     round read only the unsealed rows, however large the feed.
//
// A sealer round is one transaction: the feed lock (the generations row,
// FOR UPDATE) first, then, in a statement of its own and so with a snapshot
// taken after the lock was granted, the seal: up to `limit` unsealed rows
// that no open writer holds (FOR UPDATE SKIP LOCKED), moved to sealed at
// head+1.., the head moved past them, and one notify. Rounds are serialised
// by the feed lock, which each holds to its commit, and each hands out seqs
// above all earlier ones, so a reader that read seq s never later sees a new
// row below s, even when two sealers overlap (a lease handed over while the
// old holder's round is in flight). A writer that commits after a round's
// snapshot is sealed by the next round.

// sealVariant is how a sealer builds its round. sealRight is the design; the
// others are broken on purpose, each in one way, for sealed_test.go to show
// which break the ordering argument and which only its liveness.
type sealVariant int

const (
	sealRight        sealVariant = iota
	sealNoSkip                   // FOR UPDATE without SKIP LOCKED: waits for an open writer
	sealSequence                 // no feed lock: seqs from a sequence
	sealOneStatement             // the feed lock and the seal in one statement, so one snapshot taken before the lock
	sealUnlocked                 // the unsealed rows read without a row lock, then sealed with what was read
)

func (v sealVariant) String() string {
	return [...]string{"right", "no SKIP LOCKED", "no feed lock (sequence)", "snapshot before the lock", "no row lock (read, then write)"}[v]
}

// sealedFeed is one experimental feed on a fresh schema: its rows table,
// the generations row of pgfeed's schema as its feed lock and head, and the
// statements of writers, sealers and readers.
type sealedFeed struct {
	feed                   string
	rows, gens, seqs       string
	channel                string
	write, probe, lockFeed string
	read                   string
}

// newSealedFeed creates the experiment's rows table and the feed's
// generations row on s.
func (s *schema) newSealedFeed(ctx context.Context, name string) (*sealedFeed, error) {
	f := &sealedFeed{feed: name, rows: s.qualify("x_sealed"), gens: s.table("generations"), seqs: s.qualify("x_sealed_seqs"), channel: "kairos_bench_x_" + s.name}
	setup := []string{
		`CREATE TABLE ` + f.rows + ` (
	feed        text COLLATE "C" NOT NULL,
	key         text COLLATE "C" NOT NULL,
	seq         bigint CHECK (seq >= 1),
	doc         jsonb,
	pending     boolean NOT NULL DEFAULT false,
	pending_doc jsonb,
	PRIMARY KEY (feed, key),
	UNIQUE (feed, seq),
	CHECK (pending OR pending_doc IS NULL)
)`,
		`CREATE INDEX x_sealed_pending ON ` + f.rows + ` (feed, key) WHERE pending`,
		`CREATE SEQUENCE ` + f.seqs,
		`INSERT INTO ` + f.gens + ` (feed, head) VALUES ('` + name + `', 0)`,
	}
	for _, q := range setup {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("preparing the sealed feed: %w", err)
		}
	}
	f.write = `INSERT INTO ` + f.rows + ` AS r (feed, key, pending, pending_doc) VALUES ('` + name + `', $1::text, true, $2::text::jsonb)
ON CONFLICT (feed, key) DO UPDATE SET pending = true, pending_doc = excluded.pending_doc`
	f.probe = `SELECT EXISTS (SELECT 1 FROM ` + f.rows + ` WHERE feed = $1::text AND pending)`
	f.lockFeed = `SELECT head FROM ` + f.gens + ` WHERE feed = $1::text FOR UPDATE`
	f.read = `SELECT key, seq, doc::text FROM ` + f.rows + ` WHERE feed = $1::text AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint`
	return f, nil
}

// sealStatement is the seal of a round: $1 the feed, $2 the round's bound,
// $3 the channel. It returns the keys sealed, and notifies once when there
// were any. lock is how it locks the unsealed rows; seq how it numbers
// them; pre, when set, is a CTE that takes the feed lock inside the
// statement (sealOneStatement).
func (f *sealedFeed) sealStatement(lock string, fromSequence, lockInside bool) string {
	pre, guard := "", ""
	if lockInside {
		pre = `l AS (SELECT head FROM ` + f.gens + ` WHERE feed = $1::text FOR UPDATE), `
		guard = ` AND (SELECT head FROM l) IS NOT NULL`
	}
	c := `c AS (
	SELECT key FROM ` + f.rows + ` WHERE feed = $1::text AND pending` + guard + ` ORDER BY key LIMIT $2::bigint ` + lock + `
), o AS (
	SELECT key, row_number() OVER (ORDER BY key) AS ord FROM c
)`
	var seal string
	if fromSequence {
		seal = `, s AS (
	UPDATE ` + f.rows + ` AS r SET seq = nextval('` + f.seqs + `'), doc = r.pending_doc, pending = false, pending_doc = NULL
	FROM o WHERE r.feed = $1::text AND r.key = o.key
	RETURNING r.key
)`
	} else {
		seal = `, g AS (
	UPDATE ` + f.gens + ` SET head = head + (SELECT count(*) FROM c)
	WHERE feed = $1::text AND EXISTS (SELECT 1 FROM c)
	RETURNING head - (SELECT count(*) FROM c) AS base
), s AS (
	UPDATE ` + f.rows + ` AS r SET seq = g.base + o.ord, doc = r.pending_doc, pending = false, pending_doc = NULL
	FROM o, g WHERE r.feed = $1::text AND r.key = o.key
	RETURNING r.key
)`
	}
	return `WITH ` + pre + c + seal + `
SELECT s.key FROM s
UNION ALL
SELECT NULL FROM (SELECT pg_notify($3::text, $1::text)) AS n WHERE EXISTS (SELECT 1 FROM s)`
}

// sealer runs rounds on one feed until its context ends: a probe of the
// partial index on an adaptive poll (minPoll after a round that sealed
// something, no wait after a full round, doubling up to maxPoll while the
// probe finds nothing), and a round when the probe finds rows.
type sealer struct {
	f                *sealedFeed
	pool             *pgxpool.Pool
	variant          sealVariant
	limit            int
	minPoll, maxPoll time.Duration
	// jitter, when set, holds each round open for up to that long before
	// its commit: the test's way to make overlapping rounds of two sealers
	// commit in either order.
	jitter time.Duration
	// gate pauses the sealer: it holds a read lock across each probe and
	// round, so a test that takes the write lock knows no round runs.
	gate *sync.RWMutex
	// sealed, when set, is told after each round's commit which keys it
	// sealed.
	sealed func(keys []string, at time.Time)

	rounds, rows atomic.Int64
	statement    string
}

func (s *sealer) run(ctx context.Context) error {
	switch s.variant {
	case sealRight:
		s.statement = s.f.sealStatement("FOR UPDATE SKIP LOCKED", false, false)
	case sealNoSkip:
		s.statement = s.f.sealStatement("FOR UPDATE", false, false)
	case sealSequence:
		s.statement = s.f.sealStatement("FOR UPDATE SKIP LOCKED", true, false)
	case sealOneStatement:
		s.statement = s.f.sealStatement("FOR UPDATE SKIP LOCKED", false, true)
	case sealUnlocked:
		// built in roundUnlocked
	}
	wait := s.minPoll
	for {
		if s.gate != nil {
			s.gate.RLock()
		}
		n, err := s.step(ctx)
		if s.gate != nil {
			s.gate.RUnlock()
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case n >= s.limit:
			wait = 0
		case n > 0:
			wait = s.minPoll
		default:
			wait = min(max(2*wait, s.minPoll), s.maxPoll)
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
	}
}

// step probes and, when the probe finds unsealed rows, runs a round; it
// returns how many rows the round sealed.
func (s *sealer) step(ctx context.Context) (int, error) {
	var any bool
	if err := s.pool.QueryRow(ctx, s.f.probe, s.f.feed).Scan(&any); err != nil || !any {
		return 0, err
	}
	var keys []string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		keys = keys[:0]
		var err error
		if s.variant == sealUnlocked {
			keys, err = s.roundUnlocked(ctx, tx)
		} else {
			keys, err = s.round(ctx, tx)
		}
		if err == nil && s.jitter > 0 {
			time.Sleep(rand.N(s.jitter))
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	s.rounds.Add(1)
	s.rows.Add(int64(len(keys)))
	if s.sealed != nil && len(keys) > 0 {
		s.sealed(keys, time.Now())
	}
	return len(keys), nil
}

func (s *sealer) round(ctx context.Context, tx pgx.Tx) ([]string, error) {
	if s.variant != sealSequence && s.variant != sealOneStatement {
		var head int64
		if err := tx.QueryRow(ctx, s.f.lockFeed, s.f.feed).Scan(&head); err != nil {
			return nil, err
		}
	}
	rows, err := tx.Query(ctx, s.statement, s.f.feed, s.limit, s.f.channel)
	if err != nil {
		return nil, err
	}
	var keys []string
	for rows.Next() {
		var k *string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return nil, err
		}
		if k != nil {
			keys = append(keys, *k)
		}
	}
	return keys, rows.Err()
}

// roundUnlocked is sealUnlocked's round: under the feed lock, it reads the
// unsealed rows without locking them, then seals each with the document it
// read, so a writer that commits between the two has its document dropped.
func (s *sealer) roundUnlocked(ctx context.Context, tx pgx.Tx) ([]string, error) {
	var head int64
	if err := tx.QueryRow(ctx, s.f.lockFeed, s.f.feed).Scan(&head); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT key, pending_doc::text FROM `+s.f.rows+` WHERE feed = $1::text AND pending ORDER BY key LIMIT $2::bigint`, s.f.feed, s.limit)
	if err != nil {
		return nil, err
	}
	var keys []string
	var docs []*string
	for rows.Next() {
		var k string
		var d *string
		if err := rows.Scan(&k, &d); err != nil {
			rows.Close()
			return nil, err
		}
		keys, docs = append(keys, k), append(docs, d)
	}
	if err := rows.Err(); err != nil || len(keys) == 0 {
		return nil, err
	}
	if s.jitter > 0 {
		time.Sleep(rand.N(s.jitter))
	}
	_, err = tx.Exec(ctx, `WITH g AS (
	UPDATE `+s.f.gens+` SET head = head + cardinality($2::text[]) WHERE feed = $1::text RETURNING head - cardinality($2::text[]) AS base
)
UPDATE `+s.f.rows+` AS r SET seq = g.base + c.ord, doc = c.doc::jsonb, pending = false, pending_doc = NULL
FROM g, unnest($2::text[], $3::text[]) WITH ORDINALITY AS c(key, doc, ord)
WHERE r.feed = $1::text AND r.key = c.key`, s.f.feed, keys, docs)
	return keys, err
}

// startSealer starts a sealer with the bench's round bound and poll on its
// own pool, whose statements counter counts; stop ends it and returns its
// error, if it failed.
func (e *env) startSealer(ctx context.Context, f *sealedFeed, counter *queryCounter, sealed func([]string, time.Time)) (*sealer, func() error, error) {
	p, err := e.pool(ctx, 2, counter)
	if err != nil {
		return nil, nil, err
	}
	s := &sealer{f: f, pool: p, variant: sealRight, limit: sealLimit, minPoll: sealMinPoll, maxPoll: sealMaxPoll, sealed: sealed}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.run(runCtx) }()
	return s, func() error { cancel(); err := <-done; p.Close(); return err }, nil
}

// The sealer's settings in the bench: a round seals at most sealLimit rows;
// the poll runs from sealMinPoll, while rows keep coming, to sealMaxPoll,
// idle (at most 1/sealMaxPoll probes a second).
const (
	sealLimit   = 1000
	sealMinPoll = 500 * time.Microsecond
	sealMaxPoll = 100 * time.Millisecond
)

// sealedRun is one run of the sealing lag measurement.
type sealedRun struct {
	p50, p99 float64 // ms from a writer's commit to the round that sealed it committing
	idle     float64 // the sealer's statements per second with no writers
	rounds   float64 // rows per round
}

// sealLag paces LatencyRate single-change commits a second from Writers
// writers for LatencyFor (each commit an app upsert and the unsealed feed
// upsert, as in X sealed), with a sealer running, and measures each
// commit's time to its sealing; then, with the writers gone, the sealer's
// idle statements over IdleFor.
func (e *env) sealLag(ctx context.Context, admin *pgxpool.Pool) (sealedRun, error) {
	sz := e.sizes
	s, err := e.newSchema(ctx, admin)
	if err != nil {
		return sealedRun{}, err
	}
	defer s.drop()
	t, err := s.rawTable(ctx, "app")
	if err != nil {
		return sealedRun{}, err
	}
	f, err := s.newSealedFeed(ctx, "p3")
	if err != nil {
		return sealedRun{}, err
	}
	n := int(float64(sz.LatencyRate) * sz.LatencyFor.Seconds())
	committed := make([]time.Time, n)
	var mu sync.Mutex
	sealedAt := make(map[string]time.Time, n)
	counter := &queryCounter{}
	sl, stop, err := e.startSealer(ctx, f, counter, func(keys []string, at time.Time) {
		mu.Lock()
		for _, k := range keys {
			sealedAt[k] = at
		}
		mu.Unlock()
	})
	if err != nil {
		return sealedRun{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	app := `INSERT INTO ` + t + ` (key, doc) VALUES ($1::text, $2::text::jsonb) ON CONFLICT (key) DO UPDATE SET doc = excluded.doc`
	commit := func(i int) error {
		key, doc := fmt.Sprintf("k%08d", i), string(doc300(i))
		return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, app, key, doc); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, f.write, key, doc)
			return err
		})
	}
	// Warm-up: one commit through to its sealing.
	if err := commit(n); err != nil {
		return sealedRun{}, err
	}
	warm := fmt.Sprintf("k%08d", n)
	if err := waitFor(ctx, func() bool { mu.Lock(); defer mu.Unlock(); _, ok := sealedAt[warm]; return ok }); err != nil {
		return sealedRun{}, err
	}
	interval := time.Second / time.Duration(sz.LatencyRate)
	start := time.Now()
	errs := make(chan error, sz.Writers)
	for w := range sz.Writers {
		go func() {
			for i := w; i < n; i += sz.Writers {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				if err := commit(i); err != nil {
					errs <- err
					return
				}
				committed[i] = time.Now()
			}
			errs <- nil
		}()
	}
	var firstErr error
	for range sz.Writers {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return sealedRun{}, firstErr
	}
	if achieved := float64(n) / time.Since(start).Seconds(); sz.StrictRate && achieved < 0.9*float64(sz.LatencyRate) {
		return sealedRun{}, fmt.Errorf("commits ran at %.0f/s, short of the %d/s asked", achieved, sz.LatencyRate)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = waitFor(waitCtx, func() bool { mu.Lock(); defer mu.Unlock(); return len(sealedAt) > n })
	cancel()
	if err != nil {
		return sealedRun{}, fmt.Errorf("%d of %d commits were sealed: %w", len(sealedAt)-1, n, err)
	}
	lat := make([]time.Duration, n)
	mu.Lock()
	for i := range n {
		lat[i] = max(0, sealedAt[fmt.Sprintf("k%08d", i)].Sub(committed[i]))
	}
	mu.Unlock()
	slices.Sort(lat)
	rounds, rows := sl.rounds.Load(), sl.rows.Load()

	q0 := counter.n.Load()
	idleStart := time.Now()
	time.Sleep(sz.IdleFor)
	q1 := counter.n.Load()
	idle := float64(q1-q0) / time.Since(idleStart).Seconds()
	stopped = true
	if err := stop(); err != nil {
		return sealedRun{}, fmt.Errorf("the sealer failed: %w", err)
	}
	e.logf("X seal lag: %d commits sealed in %d rounds (%.1f rows a round)", rows, rounds, float64(rows)/float64(max(rounds, 1)))
	return sealedRun{p50: percentile(lat, 0.50), p99: percentile(lat, 0.99), idle: idle, rounds: float64(rows) / float64(max(rounds, 1))}, nil
}
