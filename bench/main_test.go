package main

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The P5 child re-executes this binary; under `go test` it is the test
	// binary, so the child's work is started here.
	if runChild() {
		os.Exit(0)
	}
	// Every worker, listener, pool and Watermill subscriber a measurement
	// starts must be gone when it returns; bleve's analysis workers are a
	// pool of the library's own, started when it loads.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

// TestSmoke runs every row of the table at the tiny sizes and fails unless
// each one produced a finite figure (and baseline and ratio, where the row
// has them). It checks that the harness still measures, not the targets: at
// these sizes the ratios mean nothing.
func TestSmoke(t *testing.T) {
	e := &env{url: databaseURL(), sizes: TinySizes, log: testWriter{t}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := e.pool(ctx, 1, nil)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL is unavailable (CI is set, so this is a failure): %v", err)
		}
		t.Skipf("PostgreSQL is unavailable: %v", err)
	}
	p.Close()
	rows, err := runAll(ctx, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, id := range []string{"P1", "P1 app", "P2", "P3 p99", "P3 p50", "P3 vs 1s", "P3 vs 1ms", "P3 idle q", "P3 idle q 1s", "P3 idle WAL", "P3c p99", "P3c p50", "P3c idle q",
		"P4 vs 100", "P4 vs 1000", "P5a", "P5b", "P6", "P6 notify", "P6c", "P6 batched", "P6c batched", "D", "C", "M p50", "M p99", "S memfeed", "S pgtable", "S mysql", "S webhook", "S webhook signed", "S webhook hmac", "S kafka", "S bleve", "S nats", "S redis", "K update", "K update floor", "K update unchanged", "K update concurrent", "K update concurrent sealed", "K writers", "K writers concurrent", "K backfill", "K backfill floor", "K backfill concurrent", "K backfill new generation", "K backfill rebuild", "K backfill again", "K backfill floor parallel"} {
		want[id] = true
	}
	var b strings.Builder
	printTable(&b, rows)
	t.Logf("tiny table:\n%s", b.String())
	for _, r := range rows {
		if !want[r.ID] {
			t.Errorf("unexpected row %q", r.ID)
		}
		delete(want, r.ID)
		if err := r.Finite(); err != nil {
			t.Error(err)
		}
	}
	for id := range want {
		t.Errorf("row %s is missing", id)
	}
}

// TestFiniteRefusesNonFigures proves the smoke test's check can fail: rows
// with a NaN, an infinite or a zero figure, or a missing sample, are refused.
func TestFiniteRefusesNonFigures(t *testing.T) {
	ok := newRow("X", "x", "ms", []float64{1, 2, 3}, []float64{2}, "figure/baseline", div, "", nil)
	if err := ok.Finite(); err != nil {
		t.Fatalf("a measured row is refused: %v", err)
	}
	bad := map[string]Row{
		"no samples":    newRow("X", "x", "ms", nil, nil, "", nil, "", nil),
		"zero figure":   newRow("X", "x", "ms", []float64{0}, nil, "", nil, "", nil),
		"zero baseline": newRow("X", "x", "ms", []float64{1}, []float64{0}, "figure/baseline", div, "", nil),
		"nan baseline":  newRow("X", "x", "ms", []float64{1}, []float64{}, "figure/baseline", div, "", nil),
	}
	inf := ok
	inf.Figure.Max = math.Inf(1)
	bad["infinite"] = inf
	for name, r := range bad {
		if err := r.Finite(); err == nil {
			t.Errorf("%s: accepted %+v", name, r)
		}
	}
	zero := newRow("X", "x", "B/s", []float64{0}, nil, "", nil, "", nil)
	zero.ZeroOK = true
	if err := zero.Finite(); err != nil {
		t.Errorf("a zero allowed to be zero is refused: %v", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestExperimentsSmoke runs group X, which the table leaves out, at the tiny
// sizes: its rows must be measured too.
func TestExperimentsSmoke(t *testing.T) {
	e := &env{url: databaseURL(), sizes: TinySizes, log: testWriter{t}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := e.pool(ctx, 1, nil)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL is unavailable (CI is set, so this is a failure): %v", err)
		}
		t.Skipf("PostgreSQL is unavailable: %v", err)
	}
	p.Close()
	rows, err := runAll(ctx, e, []string{"X"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 9 {
		t.Fatalf("group X gave %d rows, want 9", len(rows))
	}
	for _, r := range rows {
		if err := r.Finite(); err != nil {
			t.Error(err)
		}
	}
}
