package main

import (
	"context"
	"fmt"
)

// Group X is not part of the table: it measures what P6's target would take,
// by running P6's writers with the feed write built other ways, each against
// the same plain transactions in the same run. None of these writes is one
// the library could ship as it stands; each removes one cost of the feed
// write to see what is left:
//
//   - "at commit": the row goes in at once, and the feed lock (the
//     generations row) and the notify are taken by a deferred constraint
//     trigger, so at commit, server side: the lock is no longer held across
//     the client's round trip between its feed write and its COMMIT, only
//     across the commit itself. Seqs would then have to be handed out by the
//     trigger, a second write of each row, which this leaves out: it is the
//     best that taking the lock late could do.
//   - "no lock, notify": the row at a seq from a sequence and a pg_notify, no
//     feed lock at all. Seqs then no longer follow commit order (guarantee 2
//     would need readers to stop below the oldest writer still open); this is
//     what such a design would cost writers.
//   - "no lock, silent": the same without the notify: the cost of the row
//     alone, what is left if wake-ups came some other way.
//
// A run of group X (BENCHMARKS.md) put only the last clear of 0.5×; without
// the lock but with a notify per commit it landed on the line (0.40–0.51×),
// because PostgreSQL queues notifications under one lock held through every
// notifying commit.

// experimentalWrite prepares schema s for mode's feed write and returns its
// statement, which takes the key and the document; "" for the modes that are
// not group X's.
func (s *schema) experimentalWrite(ctx context.Context, mode p6Mode) (string, error) {
	switch mode {
	case p6AtCommit, p6Unordered, p6UnorderedSilent:
	default:
		return "", nil
	}
	g, r, seqs := s.table("generations"), s.table("rows"), s.qualify("x_seqs")
	setup := []string{
		`INSERT INTO ` + g + ` (feed, head) VALUES ('p6', 0)`,
		`CREATE SEQUENCE ` + seqs,
	}
	switch mode {
	case p6AtCommit:
		fn := s.qualify("x_at_commit")
		setup = append(setup,
			`CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE `+g+` SET head = head + 1 WHERE feed = 'p6';
	PERFORM pg_notify('kairos_bench_p6', 'p6');
	RETURN NULL;
END $$`,
			`CREATE CONSTRAINT TRIGGER x_at_commit AFTER INSERT OR UPDATE ON `+r+`
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	}
	for _, q := range setup {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("preparing %s: %w", mode, err)
		}
	}
	row := `INSERT INTO ` + r + ` AS r (feed, key, seq, doc) VALUES ('p6', $1::text, nextval('` + seqs + `'), $2::text::jsonb)
ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc`
	if mode == p6Unordered {
		row = `WITH w AS (` + row + `) SELECT pg_notify('kairos_bench_p6', 'p6')`
	}
	return row, nil
}

// measureExperiments runs group X: P6's writers with the stock feed write,
// with each experimental one, and without any, interleaved run by run.
func (e *env) measureExperiments(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, int32(sz.Writers)+2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	modes := []p6Mode{p6Plain, p6Feed, p6AtCommit, p6Unordered, p6UnorderedSilent, p6Sealed}
	fns := make([]func(int) (float64, error), len(modes))
	for i, m := range modes {
		fns[i] = func(int) (float64, error) { return e.commitRate(ctx, admin, m) }
	}
	out, err := interleaveN(sz.Runs, fns...)
	if err != nil {
		return nil, err
	}
	desc := fmt.Sprintf("P6 experiment, %d writers, one change per transaction; baseline: the same transactions without the feed write; figure: ", sz.Writers)
	target := func(_, r float64) bool { return r >= 0.5 }
	var rows []Row
	for i, id := range []string{"X stock", "X at commit", "X no lock", "X silent"} {
		rows = append(rows, newRow(id, desc+modes[i+1].String(), "commits/s", out[i+1], out[0], "figure/baseline", div, "≥ 0.5×", target))
	}
	rows = append(rows, newRow("X sealed", desc+modes[5].String()+" (issue 13's target)", "commits/s", out[5], out[0], "figure/baseline", div, "≥ 0.6×",
		func(_, r float64) bool { return r >= 0.6 }))
	// How far sealing lags at P3's rate, and the sealer's idle cost: no
	// baseline, the absolute bounds.
	var lag []sealedRun
	for range sz.Runs {
		r, err := e.sealLag(ctx, admin)
		if err != nil {
			return nil, fmt.Errorf("X seal lag: %w", err)
		}
		lag = append(lag, r)
	}
	pick := func(f func(sealedRun) float64) []float64 {
		var out []float64
		for _, r := range lag {
			out = append(out, f(r))
		}
		return out
	}
	lagDesc := fmt.Sprintf("deferred sealing, commit → sealed (the sealing round's commit) at %d commits/s from %d writers, ", sz.LatencyRate, sz.Writers)
	idle := newRow("X seal idle q", "deferred sealing, the sealer's statements/s with no writers (client side)", "q/s",
		pick(func(r sealedRun) float64 { return r.idle }), nil, "", nil, "≤ 20 q/s", func(f, _ float64) bool { return f <= 20 })
	idle.ZeroOK = true
	rows = append(rows,
		newRow("X seal p50", lagDesc+"p50", "ms", pick(func(r sealedRun) float64 { return r.p50 }), nil, "", nil, "", nil),
		newRow("X seal p99", lagDesc+"p99 (P3's bound is on commit → sink)", "ms", pick(func(r sealedRun) float64 { return r.p99 }), nil, "", nil,
			"≤ 10 ms", func(f, _ float64) bool { return f <= 10 }),
		newRow("X seal round", "deferred sealing at that rate, rows sealed per round", "rows", pick(func(r sealedRun) float64 { return r.rounds }), nil, "", nil, "", nil),
		idle)
	return rows, nil
}
