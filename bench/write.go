package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// rawTable creates the table a baseline writes into: the same rows without
// the feed, a key and its document.
func (s *schema) rawTable(ctx context.Context, name string) (string, error) {
	t := s.qualify(name)
	_, err := s.pool.Exec(ctx, `CREATE TABLE `+t+` (key text COLLATE "C" PRIMARY KEY, doc jsonb NOT NULL)`)
	return t, err
}

// measureP1 times one transaction writing WriteChanges changes of about 300
// bytes through the feed, against the same rows upserted into a table built
// like the feed's by one unnest statement, and into an app's (key, doc) table.
// Every transaction writes keys never written before, so every side inserts.
// Each run opens a fresh schema per side and then takes turns transaction by
// transaction, the order rotating, so that a drift of the machine, which on a
// shared one comes in bursts of seconds, hits the three alike. Figures are
// milliseconds per transaction, each side's median over the run's WriteTxs
// transactions after one warm-up transaction each.
func (e *env) measureP1(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	// Each side gets its input in the form its API takes, built before the
	// clock starts: strings for the raw statements, changes for the feed.
	type input struct {
		keys, docs []string
		changes    []feed.Change
	}
	batch := func(tx, n int) input {
		in := input{keys: make([]string, n), docs: make([]string, n), changes: make([]feed.Change, n)}
		for i := range n {
			doc := doc300(tx*n + i)
			in.keys[i] = fmt.Sprintf("t%05d-%05d", tx, i)
			in.docs[i] = string(doc)
			in.changes[i] = feed.Put(feed.Key(in.keys[i]), doc)
		}
		return in
	}
	// side is one way of writing a transaction's rows, ready to run.
	type side struct {
		body func(tx pgx.Tx, in input) error
		per  []float64
	}
	out := make([][]float64, 3)
	for range sz.Runs {
		err := func() error {
			var schemas []*schema
			defer func() {
				for _, s := range schemas {
					s.drop()
				}
			}()
			fresh := func() (*schema, error) {
				s, err := e.newSchema(ctx, admin)
				if err == nil {
					schemas = append(schemas, s)
				}
				return s, err
			}
			// The subject: the feed's own write.
			fs, err := fresh()
			if err != nil {
				return err
			}
			st, err := fs.store(ctx, admin)
			if err != nil {
				return err
			}
			defer st.Close()
			subject := &side{body: func(tx pgx.Tx, in input) error {
				_, err := st.Write(ctx, tx, "p1", in.changes)
				return err
			}}
			// raw writes the same rows to a table built like the feed's rows
			// table (same columns, keys, indexes and checks), seqs handed out
			// by the client: the raw limit of writing exactly what the feed
			// stores.
			rs, err := fresh()
			if err != nil {
				return err
			}
			t := rs.qualify("raw_rows")
			if _, err := admin.Exec(ctx, `CREATE TABLE `+t+` (LIKE `+rs.table("rows")+` INCLUDING ALL)`); err != nil {
				return err
			}
			rawQ := `INSERT INTO ` + t + ` AS r (feed, key, seq, doc)
SELECT 'p1', c.key, $3::bigint + c.ord, c.doc::jsonb FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS c(key, doc, ord)
ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc`
			var next int64
			raw := &side{body: func(tx pgx.Tx, in input) error {
				_, err := tx.Exec(ctx, rawQ, in.keys, in.docs, next)
				next += int64(len(in.keys))
				return err
			}}
			// app writes the same documents to the app's own kind of table, a
			// key and a document: what the transaction costs without any feed.
			as, err := fresh()
			if err != nil {
				return err
			}
			at, err := as.rawTable(ctx, "raw")
			if err != nil {
				return err
			}
			appQ := `INSERT INTO ` + at + ` (key, doc) SELECT c.key, c.doc::jsonb FROM unnest($1::text[], $2::text[]) AS c(key, doc)
ON CONFLICT (key) DO UPDATE SET doc = excluded.doc`
			app := &side{body: func(tx pgx.Tx, in input) error {
				_, err := tx.Exec(ctx, appQ, in.keys, in.docs)
				return err
			}}
			sides := []*side{subject, raw, app}
			for i := range sz.WriteTxs + 1 { // the first round is the warm-up
				in := batch(i, sz.WriteChanges)
				for j := range sides {
					sd := sides[(i+j)%len(sides)]
					start := time.Now()
					if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error { return sd.body(tx, in) }); err != nil {
						return err
					}
					if i > 0 {
						sd.per = append(sd.per, float64(time.Since(start).Nanoseconds())/1e6)
					}
				}
			}
			for k, sd := range sides {
				out[k] = append(out[k], summarize(sd.per).Median)
			}
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	return []Row{
		newRow("P1", fmt.Sprintf("feed write: %d changes (300-byte JSON) in the app's transaction, per transaction; baseline: the same rows upserted raw by one unnest into a table like the feed's", sz.WriteChanges),
			"ms", out[0], out[1], "figure/baseline", div, "≤ 1.25×", func(_, r float64) bool { return r <= 1.25 }),
		newRow("P1 app", "the same feed write; baseline: the same documents upserted by one unnest into a (key, doc) table",
			"ms", out[0], out[2], "figure/baseline", div, "", nil),
	}, nil
}

// measureP6 runs Writers concurrent writers for WritersFor, each committing
// transactions of one upsert into the app's table plus, for the subject, one
// change written to the feed; the baseline commits the same transactions
// without the feed write. Figures are commits per second.
func (e *env) measureP6(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, int32(sz.Writers)+2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	run := func(mode p6Mode) (float64, error) { return e.commitRate(ctx, admin, mode) }
	out, err := interleaveN(sz.Runs,
		func(int) (float64, error) { return run(p6Feed) },
		func(int) (float64, error) { return run(p6Plain) },
		func(int) (float64, error) { return run(p6Notify) },
		func(int) (float64, error) { return run(p6Concurrent) },
		func(int) (float64, error) { return run(p6Batched) },
		func(int) (float64, error) { return run(p6ConcurrentBatched) })
	if err != nil {
		return nil, err
	}
	return []Row{
		newRow("P6", fmt.Sprintf("%d concurrent writers, one change per transaction, commit rate; baseline: the same transactions without the feed write", sz.Writers),
			"commits/s", out[0], out[1], "figure/baseline", div, "≥ 0.5×", func(_, r float64) bool { return r >= 0.5 }),
		newRow("P6 notify", "the same transactions with a pg_notify and no feed write (the wake-up's share of the cost); baseline: without either",
			"commits/s", out[2], out[1], "figure/baseline", div, "", nil),
		newRow("P6c", fmt.Sprintf("concurrent write mode: %d concurrent writers, one change per transaction, commit rate, the store's sealer running beside; baseline: the same transactions without the feed write", sz.Writers),
			"commits/s", out[3], out[1], "figure/baseline", div, "≥ 0.6×", func(_, r float64) bool { return r >= 0.6 }),
		newRow("P6 batched", "the P6 transactions with the feed write queued by QueueWrite on the app's own batch (one round trip for both statements); baseline: the same transactions without the feed write",
			"commits/s", out[4], out[1], "figure/baseline", div, "", nil),
		newRow("P6c batched", "the P6c transactions (concurrent mode, sealer beside) with the feed write queued by QueueWrite on the app's own batch; baseline: the same transactions without the feed write",
			"commits/s", out[5], out[1], "figure/baseline", div, "≥ 0.6×", func(_, r float64) bool { return r >= 0.6 }),
	}, nil
}

// p6Mode is what a P6 transaction adds to the app's own upsert.
type p6Mode int

const (
	p6Plain  p6Mode = iota // nothing: the baseline
	p6Feed                 // one change written to the feed
	p6Notify               // a pg_notify only, as the feed write sends
	// The modes of group X, each a feed write built another way, to measure
	// what P6 would gain from it (see experiment.go).
	p6AtCommit        // the row, then the feed lock and the notify at commit
	p6Unordered       // the row at a seq from a sequence, then a notify: no feed lock
	p6UnorderedSilent // the row at a seq from a sequence, no notify
	p6Sealed          // the row upserted unsealed, a sealer running beside (sealed.go)
	p6Concurrent      // the feed write in pgfeed's concurrent mode, its sealer running beside
	// The feed write queued with QueueWrite on the batch that carries the
	// app's upsert, in the locked and the concurrent mode: the transaction
	// keeps the baseline's shape (BEGIN, one round trip of statements,
	// COMMIT), where Write adds a round trip of its own.
	p6Batched
	p6ConcurrentBatched
)

func (m p6Mode) String() string {
	return [...]string{"without the feed", "with the feed write", "with a pg_notify only",
		"feed lock and notify at commit", "no feed lock, a notify", "no feed lock, no notify",
		"unsealed, a sealer beside", "the feed write, concurrent mode",
		"the feed write queued on the app's batch", "the feed write queued on the app's batch, concurrent mode"}[m]
}

// commitRate runs Writers concurrent writers for WritersFor, each committing
// transactions of one upsert into the app's table plus what mode adds, on a
// fresh schema, and returns commits per second.
func (e *env) commitRate(ctx context.Context, admin *pgxpool.Pool, mode p6Mode) (float64, error) {
	sz := e.sizes
	s, err := e.newSchema(ctx, admin)
	if err != nil {
		return 0, err
	}
	defer s.drop()
	t, err := s.rawTable(ctx, "app")
	if err != nil {
		return 0, err
	}
	st, err := s.store(ctx, admin)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	row, err := s.experimentalWrite(ctx, mode)
	if err != nil {
		return 0, err
	}
	if mode == p6Concurrent || mode == p6ConcurrentBatched {
		// The store's own sealer, on a pool of its own (as a daemon's
		// would be), seals while the writers commit.
		sp, err := e.pool(ctx, 2, nil)
		if err != nil {
			return 0, err
		}
		defer sp.Close()
		sst, err := s.store(ctx, sp)
		if err != nil {
			return 0, err
		}
		defer sst.Close()
		if err := sst.SetWriteMode(ctx, "p6", feed.WriteConcurrent); err != nil {
			return 0, err
		}
		sealCtx, stopSealer := context.WithCancel(ctx)
		sealed := make(chan struct{})
		go func() { defer close(sealed); _ = sst.RunSealer(sealCtx, "p6") }()
		defer func() { stopSealer(); <-sealed }()
	}
	var sl *sealer
	if mode == p6Sealed {
		f, err := s.newSealedFeed(ctx, "p6")
		if err != nil {
			return 0, err
		}
		row = f.write
		var stop func() error
		if sl, stop, err = e.startSealer(ctx, f, &queryCounter{}, nil); err != nil {
			return 0, err
		}
		defer func() { _ = stop() }()
	}
	q := `INSERT INTO ` + t + ` (key, doc) VALUES ($1::text, $2::text::jsonb) ON CONFLICT (key) DO UPDATE SET doc = excluded.doc`
	var commits atomic.Int64
	var firstErr error
	var once sync.Once
	writeFor := func(d time.Duration, count bool) {
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		for w := range sz.Writers {
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					key := fmt.Sprintf("w%02d-%08d", w, i)
					doc := doc300(i)
					err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
						if mode == p6Batched || mode == p6ConcurrentBatched {
							b := &pgx.Batch{}
							b.Queue(q, key, string(doc))
							if err := st.QueueWrite(b, "p6", []feed.Change{feed.Put(feed.Key(key), doc)}, nil); err != nil {
								return err
							}
							return tx.SendBatch(ctx, b).Close()
						}
						if _, err := tx.Exec(ctx, q, key, string(doc)); err != nil {
							return err
						}
						switch mode {
						case p6Feed, p6Concurrent:
							_, err := st.Write(ctx, tx, "p6", []feed.Change{feed.Put(feed.Key(key), doc)})
							return err
						case p6Notify:
							_, err := tx.Exec(ctx, `SELECT pg_notify('kairos_bench_p6', $1::text)`, key)
							return err
						case p6AtCommit, p6Unordered, p6UnorderedSilent, p6Sealed:
							_, err := tx.Exec(ctx, row, key, string(doc))
							return err
						}
						return nil
					})
					if err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					if count {
						commits.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	writeFor(sz.WritersFor/5, false) // warm-up: connections, plans, the feed's first row
	var waits chan map[string]float64
	stopWaits := make(chan struct{})
	if e.stmts != nil {
		waits = make(chan map[string]float64, 1)
		go func() {
			w, err := sampleWaits(ctx, e, stopWaits)
			if err != nil {
				e.logf("sampling waits: %v", err)
			}
			waits <- w
		}()
	}
	var sealed0 int64
	if sl != nil {
		sealed0 = sl.rows.Load()
	}
	start := time.Now()
	writeFor(sz.WritersFor, true)
	elapsed := time.Since(start)
	close(stopWaits)
	if sl != nil {
		// Whether the sealer kept up: what it sealed in the window against
		// what was committed, and the rows per round.
		e.logf("X sealed: %d commits, %d sealed in the window, %d rounds in all (%.1f rows a round)",
			commits.Load(), sl.rows.Load()-sealed0, sl.rounds.Load(), float64(sl.rows.Load())/float64(max(sl.rounds.Load(), 1)))
	}
	if waits != nil {
		reportWaits(e.log, "P6 "+mode.String(), <-waits)
	}
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(commits.Load()) / elapsed.Seconds(), nil
}
