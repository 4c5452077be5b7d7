package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/syncer"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The daemon syncs a feed into a table, serves health, readiness and
// metrics, and on its context's end stops, releasing its leases, with exit 0.
func TestRunDaemon(t *testing.T) {
	schema, target := pgtest.Schema(t), pgtest.Schema(t)
	addr := pgtest.ClosedPort(t)
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  schema: %s
http:
  listen: %s
feeds:
  orders:
    poll_interval: 200ms
    sinks:
      table:
        type: pgtable
        url: %s
        schema: %s
        table: orders
        create: true
`, pgtest.URL(), schema, addr, pgtest.URL(), target))
	if code, _, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	if _, err := pool.Exec(t.Context(), `CREATE SCHEMA "`+target+`"`); err != nil {
		t.Fatal(err)
	}
	_, st := migratedOn(t, schema)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(ctx, []string{"run", "-c", cfg}, io.Discard, logs) }()
	const n = 300
	changes := make([]feed.Change, 0, n)
	for i := range n {
		changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("k%03d", i)), []byte(fmt.Sprintf(`{"i":%d}`, i))))
	}
	if _, err := st.WriteCommitted(ctx, "orders", changes); err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Delete("k000")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var live int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+target+`".orders WHERE doc IS NOT NULL`).Scan(&live)
		if err == nil && live == n-1 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("after 30s the table has %d live rows (%v), want %d; daemon log:\n%s", live, err, n-1, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	var ready struct {
		Ready bool `json:"ready"`
		Sinks []struct {
			Feed, Sink string
		} `json:"sinks"`
	}
	code, body := get(t, "http://"+addr+"/readyz")
	if err := json.Unmarshal([]byte(body), &ready); code != 200 || err != nil || !ready.Ready || len(ready.Sinks) != 1 {
		t.Errorf("/readyz = %d %q", code, body)
	}
	// 300 keys, one row each: the delete replaced k000's row (compaction).
	var fv []feedView
	code, body = get(t, "http://"+addr+"/v1/feeds")
	if err := json.Unmarshal([]byte(body), &fv); code != 200 || err != nil || len(fv) != 1 || fv[0].Feed != "orders" || fv[0].Head != n+1 {
		t.Errorf("/v1/feeds = %d %q", code, body)
	}
	var one feedView
	code, body = get(t, "http://"+addr+"/v1/feeds/orders")
	if err := json.Unmarshal([]byte(body), &one); code != 200 || err != nil || len(one.Sinks) != 1 || one.Sinks[0].Sink != "table" {
		t.Errorf("/v1/feeds/orders = %d %q", code, body)
	}
	if code, body = get(t, "http://"+addr+"/v1/feeds/nosuch"); code != 404 {
		t.Errorf("/v1/feeds/nosuch = %d %q", code, body)
	}
	if code, body = get(t, "http://"+addr+"/v1/feeds/a%20b"); code != 400 {
		t.Errorf("/v1/feeds/a b = %d %q", code, body)
	}
	want := `kairos_sink_records_applied_total{feed="orders",sink="table"} ` + fmt.Sprint(n)
	for {
		code, body = get(t, "http://"+addr+"/metrics")
		if code == 200 && strings.Contains(body, want) && strings.Contains(body, `kairos_sink_lease_held{feed="orders",sink="table"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics = %d without %q:\n%s", code, want, grepLines(body, "kairos_"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopInProcess(t, cancel, done, logs)
	d, err := st.Describe(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Sinks) != 1 || d.Sinks[0].Lease != nil && d.Sinks[0].Lease.Holder != "" {
		t.Fatalf("after a clean stop the sink's lease is still recorded: %+v", d.Sinks)
	}
	if !strings.Contains(logs.String(), "kairos stopped") {
		t.Errorf("the log does not say the daemon stopped:\n%s", logs.String())
	}
}

// A sink that cannot be built stops the start, naming its place in the file,
// before any worker runs, and never repeats its password.
func TestRunRefusesABadSink(t *testing.T) {
	schema := pgtest.Schema(t)
	const pw = "t0p-s3cret"
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  schema: %s
http:
  listen: %s
feeds:
  orders:
    sinks:
      table:
        type: pgtable
        url: postgres://app:%s@%s/app?connect_timeout=2
        table: orders
`, pgtest.URL(), schema, pgtest.ClosedPort(t), pw, pgtest.ClosedPort(t)))
	if code, _, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	code, _, stderr := kairos(t, "run", "-c", cfg)
	if code != exitFailure || !strings.Contains(stderr, "feeds.orders.sinks.table") || strings.Contains(stderr, pw) {
		t.Fatalf("run with an unreachable sink = exit %d, %q", code, stderr)
	}
	_, st := migratedOn(t, schema)
	if d, err := st.Describe(t.Context(), "orders"); err == nil && len(d.Sinks) > 0 {
		t.Fatalf("a worker ran before every sink was built: %+v", d)
	}
}

// Every sink type a file may name has a builder.
func TestEverySinkTypeBuilds(t *testing.T) {
	for name := range sinkTypes() {
		if builders[name] == nil {
			t.Errorf("sink type %q has no builder", name)
		}
	}
	for name := range builders {
		if _, ok := sinkTypes()[name]; !ok {
			t.Errorf("builder %q has no sink type", name)
		}
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// /readyz waits for every worker to hold its lease or be refused it by a
// named rival; a worker that cannot take it for another reason keeps the
// daemon unready.
func TestSettled(t *testing.T) {
	for _, c := range []struct {
		s    syncer.State
		want bool
	}{
		{syncer.State{Phase: syncer.PhaseStarting}, false},
		{syncer.State{Phase: syncer.PhaseAcquiring}, false},
		{syncer.State{Phase: syncer.PhaseBackoff}, false},
		{syncer.State{Phase: syncer.PhaseSending, LeaseHeld: true}, true},
		{syncer.State{Phase: syncer.PhaseIdle, LeaseHeld: true}, true},
		{syncer.State{Phase: syncer.PhaseStandby}, true},
		{syncer.State{Phase: syncer.PhaseAcquiring, WaitingFor: "rival"}, true},
	} {
		if got := settled(c.s); got != c.want {
			t.Errorf("settled(%s, held %v, waiting for %q) = %v", c.s.Phase, c.s.LeaseHeld, c.s.WaitingFor, got)
		}
	}
}
