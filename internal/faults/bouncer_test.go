package faults_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
)

// bouncerURL is PgBouncer in transaction mode in front of the test
// database (scripts/test starts it), with pgx's exec mode a transaction
// pooler needs: no statement prepared on one server connection and used on
// another.
func bouncerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if u == "" {
		u = "postgres://postgres@127.0.0.1:6543/postgres"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		pgtest.Unavailable(t, "PgBouncer (scripts/test starts it)", err)
	}
	conn.Close(ctx)
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set("default_query_exec_mode", "exec")
	p.RawQuery = q.Encode()
	return p.String()
}

// Fault 12. Two `kairos run` daemons reach the feed only through PgBouncer
// in transaction mode, with lease rows, and mirror it into a PostgreSQL
// table (also through PgBouncer) and a file. A holds the sinks and is
// SIGKILLed mid-stream; B takes the lapsed leases over; both sinks end equal
// to the feed (I1), the table never takes a key back (I2, watcher), B exits
// 0 on SIGTERM and no lease row names a holder (I6). Then a daemon
// configured for advisory-lock leases through the same PgBouncer is refused
// at start with an error that says why, and that repeats neither the URL nor
// the password planted in it.
func TestPgBouncerDaemons(t *testing.T) {
	t.Parallel()
	bouncer := bouncerURL(t)
	e := newEnv(t)
	target := pgtest.Schema(t)
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	body := fmt.Sprintf(daemonBody, e.schema, sinkURL(bouncer), target, path)
	a, b := newDaemon(t, "A", bouncer, body), newDaemon(t, "B", bouncer, body)
	sinks := []feed.SinkName{"table", "export"}
	a.start()
	e.put(0, 500)
	eventually(t, "A caught up through PgBouncer", 60*time.Second, e.caughtUp(sinks...))
	b.start()
	w := e.watch(e.pool, `"`+target+`".orders`)
	for i := range 10 {
		e.put(i*100, i*100+100)
		if i == 3 {
			a.kill()
		}
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, "B caught up through PgBouncer", 60*time.Second, e.caughtUp(sinks...))
	w.stop(t)
	want, _ := live(e.ctx, t, e.store, e.feed)
	sameDocs(t, "the table", readTable(t, e, target), want, nil)
	docs, err := file.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	sameDocs(t, "the file", docs, want, nil)
	b.term()
	e.checkReleased(t, sinks...)

	// The advisory lease, refused.
	p, _ := url.Parse(bouncer)
	p.User = url.UserPassword("postgres", "planted-s3cret")
	advisory := strings.Replace(fmt.Sprintf(daemonBody, e.schema, sinkURL(bouncer), target, path), "kind: row", "kind: advisory", 1)
	d := newDaemon(t, "C", p.String(), advisory)
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kairosBinary(t), "run", "-c", d.cfg).CombinedOutput()
	msg := string(out)
	t.Logf("kairos run with advisory leases through PgBouncer: %v\n%s", err, msg)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("kairos run with advisory leases through PgBouncer was not refused at start (%v)", err)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("kairos run with advisory leases through PgBouncer exited with %v; want 2, a mistake in the file", err)
	}
	if !strings.Contains(msg, "lease.kind") || !strings.Contains(msg, "advisory_lock") || !strings.Contains(msg, "transaction pooler") {
		t.Errorf("the refusal does not name the advisory lease and the transaction pooler as the reason: %s", msg)
	}
	if strings.Contains(msg, "planted-s3cret") || strings.Contains(msg, p.Host) {
		t.Errorf("the refusal repeats the URL or its password: %s", msg)
	}
}
