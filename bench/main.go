// Command bench measures Kairos against the raw PostgreSQL limit and against
// its Go peer, Watermill-sql, and prints one Markdown table: each figure, its
// baseline measured in the same run, their ratio and the target (issue 6).
//
// Absolute figures drift on a shared machine; ratios measured in one run do
// not, as long as both sides meet the same drift. So every baseline runs in
// the same process, interleaved with its subject (the order alternating run by
// run), each on a fresh schema, after a warm-up, and each row is the median of
// Runs runs with their min–max.
//
//	bench                  # the sizes, a few minutes
//	bench -tiny            # every row at a tiny size (what CI runs)
//	bench -only P3,P4      # some rows
//	bench -cpuprofile f    # the harness's CPU profile, for a missed target
//	bench -stmts           # each group's statements by client-side time
//
// The database is KAIROS_BENCH_DATABASE_URL, else KAIROS_TEST_DATABASE_URL,
// else the local PostgreSQL as user postgres.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

// measurement is one group of rows of the table.
type measurement struct {
	name string
	run  func(e *env, ctx context.Context) ([]Row, error)
	// extra groups run only when -only names them.
	extra bool
}

var measurements = []measurement{
	{"P1", (*env).measureP1, false},
	{"P2", (*env).measureLarge, false}, // P2, P5 and describe share the large feed
	{"P3", (*env).measureP3, false},
	{"P4", (*env).measureP4, false},
	{"P6", (*env).measureP6, false},
	{"C", (*env).measureCollect, false},
	{"M", (*env).measureScrape, false},
	{"S", (*env).measureSinks, false},
	{"S", (*env).measurePgtable, false}, // each sink's row, run by -only S
	{"S", (*env).measureMysql, false},
	{"S", (*env).measureWebhook, false},
	{"S", (*env).measureKafka, false},
	{"S", (*env).measureBleve, false},
	{"S", (*env).measureNats, false},
	{"S", (*env).measureRedis, false},
	{"K", (*env).measureCapture, false},
	{"X", (*env).measureExperiments, true},
}

// aliases name the rows a measurement group also produces, for -only.
var aliases = map[string]string{"P5": "P2", "D": "P2"}

// runAll runs the selected groups in order and returns every row. A group
// that fails stops the run: a table with a missing row would read as complete.
func runAll(ctx context.Context, e *env, only []string) ([]Row, error) {
	var rows []Row
	for _, m := range measurements {
		if len(only) > 0 && !slices.Contains(only, m.name) || len(only) == 0 && m.extra {
			continue
		}
		start := time.Now()
		e.logf("%s …", m.name)
		rs, err := m.run(e, ctx)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", m.name, err)
		}
		e.logf("%s done in %v", m.name, time.Since(start).Round(time.Millisecond))
		if e.stmts != nil {
			e.stmts.report(e.log, m.name)
		}
		rows = append(rows, rs...)
	}
	return rows, nil
}

func main() {
	if runChild() {
		return
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tiny := fs.Bool("tiny", false, "run every row at a tiny size (the CI smoke run)")
	runs := fs.Int("runs", 0, "measured runs per row (default 3, 1 with -tiny)")
	only := fs.String("only", "", "comma-separated groups to run: P1,P2,P3,P4,P5,P6,D,C,M,S,K, and X (experiments on P6, never run by default)")
	cpuprofile := fs.String("cpuprofile", "", "write the harness's CPU profile to this file")
	stmts := fs.Bool("stmts", false, "after each group, print its statements by client-side time")
	rate := fs.Int("rate", 0, "P3's commits per second (default 500, 100 with -tiny), for a machine that cannot keep the default")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	sizes := FullSizes
	if *tiny {
		sizes = TinySizes
	}
	if *runs < 0 {
		fmt.Fprintf(stderr, "bench: -runs is %d; it must be at least 1\n", *runs)
		return 2
	}
	if *runs > 0 {
		sizes.Runs = *runs
	}
	if *rate < 0 {
		fmt.Fprintf(stderr, "bench: -rate is %d; it must be at least 1\n", *rate)
		return 2
	}
	if *rate > 0 {
		sizes.LatencyRate = *rate
	}
	var groups []string
	for g := range strings.SplitSeq(*only, ",") {
		if g = strings.TrimSpace(strings.ToUpper(g)); g == "" {
			continue
		}
		if a, ok := aliases[g]; ok {
			g = a
		}
		if !slices.ContainsFunc(measurements, func(m measurement) bool { return m.name == g }) {
			fmt.Fprintf(stderr, "bench: -only names %q, which is not a group\n", g)
			return 2
		}
		groups = append(groups, g)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	e := &env{url: databaseURL(), sizes: sizes, log: stderr}
	if *stmts {
		e.stmts = newStmtTimer()
	}
	start := time.Now()
	rows, err := runAll(context.Background(), e, groups)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "Kairos benchmarks, %s, %s/%s, %d CPUs, %d run(s) per row, %v in all.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), sizes.Runs, time.Since(start).Round(time.Second))
	printTable(stdout, rows)
	for _, r := range rows {
		if err := r.Finite(); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
	}
	return 0
}
