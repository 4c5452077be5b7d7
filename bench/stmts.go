package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtTimer adds up, per statement text, how many times it ran and how long
// the client waited for it: the server's share of a measurement, which a Go
// CPU profile of the harness does not see.
type stmtTimer struct {
	mu    sync.Mutex
	stats map[string]*stmtStat
}

type stmtStat struct {
	n     int
	total time.Duration
}

type stmtStartKey struct{}

type stmtStart struct {
	sql string
	at  time.Time
}

func newStmtTimer() *stmtTimer { return &stmtTimer{stats: map[string]*stmtStat{}} }

func (t *stmtTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtStartKey{}, stmtStart{d.SQL, time.Now()})
}

func (t *stmtTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s, ok := ctx.Value(stmtStartKey{}).(stmtStart)
	if !ok {
		return
	}
	d := time.Since(s.at)
	key := strings.Join(strings.Fields(s.sql), " ")
	if len(key) > 90 {
		key = key[:90] + "…"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats[key]
	if st == nil {
		st = &stmtStat{}
		t.stats[key] = st
	}
	st.n++
	st.total += d
}

// report writes the statements by total time, largest first, and starts over.
func (t *stmtTimer) report(w io.Writer, group string) {
	t.mu.Lock()
	stats := t.stats
	t.stats = map[string]*stmtStat{}
	t.mu.Unlock()
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(stats[b].total - stats[a].total) })
	fmt.Fprintf(w, "bench: %s statements by client-side time:\n", group)
	for i, k := range keys {
		if i == 15 {
			break
		}
		s := stats[k]
		fmt.Fprintf(w, "  %9.1f ms  %7d×  %7.3f ms each  %s\n", float64(s.total.Microseconds())/1e3, s.n, float64(s.total.Microseconds())/1e3/float64(s.n), k)
	}
}

// bothTracers sends every trace to a counter and a timer.
type bothTracers struct {
	c *queryCounter
	t *stmtTimer
}

func (b bothTracers) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return b.t.TraceQueryStart(b.c.TraceQueryStart(ctx, c, d), c, d)
}

func (b bothTracers) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	b.t.TraceQueryEnd(ctx, c, d)
}

// sampleWaits samples, every few milliseconds until stop is closed, what the
// harness's active sessions are waiting on (pg_stat_activity), and returns
// the share of samples per wait. It shows where a server-bound measurement's
// time goes: a lock queue, a WAL flush, or the CPU ("running").
func sampleWaits(ctx context.Context, e *env, stop <-chan struct{}) (map[string]float64, error) {
	p, err := e.pool(ctx, 1, nil)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	counts := map[string]float64{}
	total := 0.0
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			for k := range counts {
				counts[k] /= total
			}
			return counts, nil
		case <-t.C:
		}
		rows, err := p.Query(ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'running') FROM pg_stat_activity
WHERE application_name = $1 AND state = 'active' AND pid <> pg_backend_pid()`, appName)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var w string
			if err := rows.Scan(&w); err != nil {
				rows.Close()
				return nil, err
			}
			counts[w]++
			total++
		}
		rows.Close()
	}
}

// reportWaits writes the wait shares, largest first.
func reportWaits(w io.Writer, what string, shares map[string]float64) {
	keys := make([]string, 0, len(shares))
	for k := range shares {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		switch {
		case shares[a] > shares[b]:
			return -1
		case shares[a] < shares[b]:
			return 1
		}
		return strings.Compare(a, b)
	})
	fmt.Fprintf(w, "bench: %s, active sessions by wait event:\n", what)
	for _, k := range keys {
		fmt.Fprintf(w, "  %5.1f%%  %s\n", 100*shares[k], k)
	}
}
