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
