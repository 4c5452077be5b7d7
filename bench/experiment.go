package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// Group X is not part of the table: it tests what would close P2's gap, by
// running the same worker over changed parts and comparing each with the
// stock worker and the raw scan in the same run.
//
//   - "sortless read": ReadBatch without the outer sort. pgfeed's statement
//     joins the generations row to the batch with a LEFT JOIN LATERAL and
//     sorts the joined rows by seq again, a sort of the batch's documents,
//     which the index scan already returns in seq order. Here generation and
//     head come from scalar subqueries in the same statement (so still one
//     snapshot) and the only ORDER BY is the index's.
//   - "async cursor commit": the store's sessions with synchronous_commit
//     off, so a cursor move does not wait for its WAL flush. A move lost to a
//     crash only makes the worker resend batches it already sent, which
//     applying idempotently makes good.
//   - "one-statement move": a cursor move with no park changes sent as its
//     one fenced UPDATE, without BEGIN and COMMIT around it (one round trip
//     instead of three); a single statement is atomic on its own.

// sortlessReader is a pgfeed store whose ReadBatch is the sortless one.
type sortlessReader struct {
	*pgfeed.Store
	pool *pgxpool.Pool
	q    string
}

func newSortlessReader(st *pgfeed.Store, p *pgxpool.Pool, s *schema) *sortlessReader {
	g, r := s.table("generations"), s.table("rows")
	return &sortlessReader{Store: st, pool: p, q: `SELECT
	(SELECT coalesce(max(generation), 1) FROM ` + g + ` WHERE feed = $1::text),
	(SELECT coalesce(max(head), 0) FROM ` + g + ` WHERE feed = $1::text),
	key, seq, doc::text
FROM ` + r + ` WHERE feed = $1::text AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint`}
}

func (r *sortlessReader) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit int) (feed.Batch, error) {
	rows, err := r.pool.Query(ctx, r.q, string(f), int64(after), int64(limit))
	if err != nil {
		return feed.Batch{}, err
	}
	defer rows.Close()
	var b feed.Batch
	for rows.Next() {
		var (
			gen, head, seq int64
			key            string
			doc            []byte
		)
		if err := rows.Scan(&gen, &head, &key, &seq, &doc); err != nil {
			return feed.Batch{}, err
		}
		b.Generation, b.Head = feed.Generation(gen), feed.Seq(head)
		b.Records = append(b.Records, feed.Record{Key: feed.Key(key), Seq: feed.Seq(seq), Doc: doc})
	}
	if err := rows.Err(); err != nil {
		return feed.Batch{}, err
	}
	if len(b.Records) == 0 { // nothing after the cursor: no records to agree with
		return r.Store.ReadBatch(ctx, f, after, limit)
	}
	return b, nil
}

// oneStatementMoves is a pgfeed store whose cursor moves without park
// changes are one statement: the same guarded UPDATE as pgfeed's, in
// autocommit. Moves with park changes go to pgfeed.
type oneStatementMoves struct {
	*pgfeed.Store
	pool *pgxpool.Pool
	q    string
}

func newOneStatementMoves(st *pgfeed.Store, p *pgxpool.Pool, s *schema) *oneStatementMoves {
	return &oneStatementMoves{Store: st, pool: p, q: `UPDATE ` + s.table("cursors") + ` SET generation = $4::bigint, seq = $5::bigint, last_advance_at = clock_timestamp()
WHERE feed = $1::text AND sink = $2::text AND lease_holder = $3::text
  AND generation IS NOT DISTINCT FROM $6::bigint AND seq IS NOT DISTINCT FROM $7::bigint`}
}

func (o *oneStatementMoves) CASCursor(ctx context.Context, m feed.CursorMove) error {
	if m.Parked.Replace || len(m.Parked.Park) > 0 || len(m.Parked.Unpark) > 0 || m.Expected.IsZero() {
		return o.Store.CASCursor(ctx, m)
	}
	if err := m.Validate(); err != nil {
		return err
	}
	tag, err := o.pool.Exec(ctx, o.q, string(m.ID.Feed), string(m.ID.Sink), string(m.Holder),
		int64(m.Next.Generation), int64(m.Next.Seq), int64(m.Expected.Generation), int64(m.Expected.Seq))
	if err != nil {
		return feed.WriteFailed("moving the cursor of "+m.ID.String(), err)
	}
	if tag.RowsAffected() == 0 {
		return &feed.CursorSupersededError{ID: m.ID}
	}
	return nil
}

func (e *env) measureExperiments(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	async, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer async.Close()
	if _, err := async.Exec(ctx, "SELECT 1"); err != nil {
		return nil, err
	}
	var stock, sortless, both, all, oneStmt, scan []float64
	for r := range sz.Runs {
		err := func() error {
			s, err := e.newSchema(ctx, admin)
			if err != nil {
				return err
			}
			defer s.drop()
			if err := s.fillFeed(ctx, "big", sz.Backlog, false); err != nil {
				return err
			}
			st, err := s.store(ctx, admin)
			if err != nil {
				return err
			}
			defer st.Close()
			cfg := async.Config().Copy()
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
			ap, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				return err
			}
			defer ap.Close()
			ast, err := s.store(ctx, ap)
			if err != nil {
				return err
			}
			defer ast.Close()
			if _, err := keysetScan(ctx, admin, s, "big", sz.Backlog); err != nil { // warm-up
				return err
			}
			n := 0
			worker := func(rd feed.Reader, ss feed.SyncStore) func(int) (float64, error) {
				return func(int) (float64, error) {
					n++
					id := feed.SinkID{Feed: "big", Sink: feed.SinkName(fmt.Sprintf("x%d", n))}
					if err := s.placeCursor(ctx, id, 0); err != nil {
						return 0, err
					}
					return catchUpRS(ctx, rd, ss, id, sz.Backlog, false)
				}
			}
			fns := []func(int) (float64, error){
				worker(st, st),
				worker(newSortlessReader(st, admin, s), st),
				worker(newSortlessReader(ast, ap, s), ast),
				worker(newSortlessReader(ast, ap, s), newOneStatementMoves(ast, ap, s)),
				worker(newSortlessReader(st, admin, s), newOneStatementMoves(st, admin, s)),
				func(int) (float64, error) { return keysetScan(ctx, admin, s, "big", sz.Backlog) },
			}
			out := make([]float64, len(fns))
			for j := range fns {
				i := (r + j) % len(fns)
				if out[i], err = fns[i](r); err != nil {
					return err
				}
			}
			stock, sortless, both = append(stock, out[0]), append(sortless, out[1]), append(both, out[2])
			all, oneStmt, scan = append(all, out[3]), append(oneStmt, out[4]), append(scan, out[5])
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	desc := fmt.Sprintf("P2 experiment, %d-row backlog; baseline: raw keyset scan", sz.Backlog)
	return []Row{
		newRow("X stock", desc+"; figure: the stock worker", "rows/s", stock, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
		newRow("X sortless", desc+"; figure: sortless ReadBatch", "rows/s", sortless, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
		newRow("X both", desc+"; figure: sortless ReadBatch and async cursor commits", "rows/s", both, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
		newRow("X durable", desc+"; figure: sortless ReadBatch and one-statement cursor moves, commits synchronous", "rows/s", oneStmt, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
		newRow("X all", desc+"; figure: sortless ReadBatch, async cursor commits and one-statement cursor moves", "rows/s", all, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
	}, nil
}
