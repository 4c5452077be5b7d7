package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
)

// daemonProc is a kairos run started as a subprocess.
type daemonProc struct {
	cmd  *exec.Cmd
	addr string
	logs *syncWriter
	done chan error
}

func startDaemon(t *testing.T, cfg, addr string, args ...string) *daemonProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{addr: addr, logs: &syncWriter{}, done: make(chan error, 1)}
	d.cmd = exec.Command(self, append([]string{"run", "-c", cfg}, args...)...)
	d.cmd.Env = append(os.Environ(), asDaemon+"=1", "KAIROS_TEST_HTTP_LISTEN="+addr)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

// metrics scrapes the daemon and parses the text format; nil while it does
// not answer.
func (d *daemonProc) metrics() map[string]*dto.MetricFamily { return scrape(d.addr) }

// stopInProcess ends the context of a kairos run started in this process
// (cancel), and fails t unless it exits 0, reported on done, within 20 s.
func stopInProcess(t *testing.T, cancel func(), done <-chan int, logs *syncWriter) {
	t.Helper()
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("the daemon stopped with exit %d:\n%s", code, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not stop within 20s of its context ending")
	}
}

// value is the metric's value for one feed and sink, and whether it is
// there.
func value(fams map[string]*dto.MetricFamily, name, f, s string) (float64, bool) {
	fam := fams[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		var lf, ls string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "feed":
				lf = l.GetValue()
			case "sink":
				ls = l.GetValue()
			}
		}
		if lf == f && ls == s {
			if g := m.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
		}
	}
	return 0, false
}

// histCount is how many observations a histogram has for feed, sink and op.
func histCount(fams map[string]*dto.MetricFamily, name, f, s, op string) uint64 {
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if got["feed"] == f && got["sink"] == s && got["op"] == op {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool, logs ...*syncWriter) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for i, l := range logs {
				fmt.Fprintf(&b, "--- daemon %d log:\n%s\n", i, l.String())
			}
			t.Fatalf("%s: not within %v\n%s", what, within, b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Two daemons over one database share a sink: one holds it, the other
// stands by. SIGKILL the holder and the other takes over once its lease
// lapses, with nothing lost; SIGTERM the survivor and it exits 0 within the
// bound, its lease released.
func TestDaemonsKillAndTerm(t *testing.T) {
	schema, target := pgtest.Schema(t), pgtest.Schema(t)
	exportPath := filepath.Join(t.TempDir(), "orders.jsonl")
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  schema: %s
lease:
  ttl: 3s
  heartbeat: 500ms
  margin: 1s
http:
  listen: ${KAIROS_TEST_HTTP_LISTEN}
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
      export:
        type: file
        path: %s
`, pgtest.URL(), schema, pgtest.URL(), target, exportPath))
	t.Setenv("KAIROS_TEST_HTTP_LISTEN", "127.0.0.1:1") // config check only; each daemon gets its own
	if code, _, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+target+`"`); err != nil {
		t.Fatal(err)
	}
	_, st := migratedOn(t, schema)

	a := startDaemon(t, cfg, pgtest.ClosedPort(t))
	held := func(d *daemonProc) func() bool {
		return func() bool {
			v, ok := value(d.metrics(), "kairos_sink_lease_held", "orders", "table")
			return ok && v == 1
		}
	}
	waitFor(t, "daemon A holds the lease", 30*time.Second, held(a), a.logs)
	b := startDaemon(t, cfg, pgtest.ClosedPort(t))
	waitFor(t, "daemon B answers", 30*time.Second, func() bool { _, ok := value(b.metrics(), "kairos_sink_lease_held", "orders", "table"); return ok }, b.logs)
	if v, _ := value(b.metrics(), "kairos_sink_lease_held", "orders", "table"); v != 0 {
		t.Fatal("both daemons hold the lease")
	}

	write := func(from, to int) {
		changes := make([]feed.Change, 0, to-from)
		for i := from; i < to; i++ {
			changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("k%04d", i)), []byte(fmt.Sprintf(`{"i":%d}`, i))))
		}
		if _, err := st.WriteCommitted(ctx, "orders", changes); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(want int) func() bool {
		return func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+target+`".orders WHERE doc IS NOT NULL`).Scan(&n)
			return err == nil && n == want
		}
	}
	write(0, 200)
	waitFor(t, "the table has the first 200 rows", 30*time.Second, rows(200), a.logs, b.logs)

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	write(200, 400)
	waitFor(t, "daemon B takes over after the ttl", 30*time.Second, held(b), b.logs)
	waitFor(t, "the table has all 400 rows", 30*time.Second, rows(400), b.logs)
	waitFor(t, "the export file has all 400 documents", 30*time.Second, func() bool {
		docs, err := file.Read(exportPath)
		return err == nil && len(docs) == 400
	}, b.logs)
	caughtUp := func() bool {
		var fv feedView
		if code, body := get(t, "http://"+b.addr+"/v1/feeds/orders"); code != 200 || json.Unmarshal([]byte(body), &fv) != nil || len(fv.Sinks) != 2 || fv.Head != 400 {
			t.Errorf("B's /v1/feeds/orders = %d %s", code, body)
		}
		fams := b.metrics()
		head, ok1 := value(fams, "kairos_feed_head", "orders", "table")
		cur, ok2 := value(fams, "kairos_sink_cursor_seq", "orders", "table")
		return ok1 && ok2 && head == 400 && cur == 400
	}
	waitFor(t, "B's metrics show the cursor at the head", 30*time.Second, caughtUp, b.logs)
	var fv feedView
	if code, body := get(t, "http://"+b.addr+"/v1/feeds/orders"); code != 200 || json.Unmarshal([]byte(body), &fv) != nil || len(fv.Sinks) != 2 || fv.Head != 400 {
		t.Errorf("B's /v1/feeds/orders = %d %s", code, body)
	}
	fams := b.metrics()
	if n := histCount(fams, "kairos_sink_call_duration_seconds", "orders", "table", "apply"); n == 0 {
		t.Errorf("B's apply durations were not observed")
	}
	if v, ok := value(fams, "kairos_sink_pending", "orders", "table"); !ok || v != 0 {
		t.Errorf("B's pending = %v, %v; want 0 once caught up", v, ok)
	}
	if _, ok := value(fams, "kairos_sink_seconds_since_last_advance", "orders", "table"); !ok {
		t.Errorf("B shows no time since its last advance")
	}

	began := time.Now()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.done:
		if err != nil {
			t.Fatalf("daemon B after SIGTERM: %v\n%s", err, b.logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("daemon B still runs 15s after SIGTERM:\n%s", b.logs.String())
	}
	t.Logf("B stopped %v after SIGTERM", time.Since(began).Round(time.Millisecond))
	d, err := st.Describe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Sinks) != 2 {
		t.Fatalf("after SIGTERM: %+v; want both sinks", d.Sinks)
	}
	for _, s := range d.Sinks {
		if s.Lease != nil || s.Cursor.Seq != 400 {
			t.Fatalf("after SIGTERM: %+v; want every cursor at 400 and no lease recorded", d.Sinks)
		}
	}
}
