package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// A daemon whose database.url goes through PgBouncer in transaction mode
// (which delivers no notifications) and whose database.listen_url reaches
// PostgreSQL directly is woken by each commit: with its poll set to an
// hour, a write still reaches the sink within seconds. Without listen_url
// the same daemon would wait for its poll, which the test would not.
func TestRunListensBesideAPooler(t *testing.T) {
	t.Parallel()
	bouncer := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if bouncer == "" {
		bouncer = "postgres://postgres@127.0.0.1:6543/postgres"
	}
	probe, err := pgx.Connect(t.Context(), bouncer)
	if err != nil {
		pgtest.Unavailable(t, "PgBouncer (scripts/test starts it)", err)
	}
	_ = probe.Close(t.Context())
	u, err := url.Parse(bouncer)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "exec") // no statement prepared on one server connection and run on another
	u.RawQuery = q.Encode()

	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	st, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  listen_url: %s
  schema: %s
http:
  listen: %s
collect:
  interval: 0s
feeds:
  orders:
    poll_interval: 1h
    sinks:
      file:
        type: file
        path: %s
`, u.String(), pgtest.URL(), schema, pgtest.ClosedPort(t), filepath.Join(t.TempDir(), "orders.jsonl")))

	dctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(dctx, []string{"run", "-c", cfg}, io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("kairos run exited %d; log:\n%s", code, logs.String())
		}
	})
	cursor := func() feed.Seq {
		c, err := st.ReadCursor(ctx, feed.SinkID{Feed: "orders", Sink: "file"})
		if err != nil {
			t.Fatal(err)
		}
		return c.Seq
	}
	w := func(k feed.Key) feed.Seq {
		res, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put(k, []byte(`{}`))})
		if err != nil {
			t.Fatal(err)
		}
		return res.Last
	}
	first := w("a")
	waitFor(t, "the first write in the sink (the worker's first read)", 30*time.Second, func() bool { return cursor() >= first }, logs)
	for _, k := range []feed.Key{"b", "c"} {
		began := time.Now()
		seq := w(k)
		waitFor(t, fmt.Sprintf("%s, written after the worker caught up, in the sink without a poll", k), 5*time.Second, func() bool { return cursor() >= seq }, logs)
		t.Logf("%s reached the sink %v after its commit", k, time.Since(began).Round(time.Millisecond))
	}
}

// A listen_url the driver cannot parse stops the start as a mistake in the
// file, named by its key, without repeating the URL or its password.
func TestRunRefusesABadListenURL(t *testing.T) {
	const secret = "l1sten-s3cret-planted"
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: %s
  listen_url: "postgres://app:%s@127.0.0.1:notaport/app"
  schema: %s
http:
  listen: %s
feeds:
  orders:
    sinks:
      file:
        type: file
        path: %s
`, pgtest.URL(), secret, pgtest.Schema(t), pgtest.ClosedPort(t), filepath.Join(t.TempDir(), "orders.jsonl")))
	code, out, stderr := kairos(t, "run", "-c", cfg)
	if code != exitUsage || !strings.Contains(stderr, "database.listen_url") {
		t.Fatalf("run with a bad listen_url = exit %d, %q; want %d naming database.listen_url", code, stderr, exitUsage)
	}
	if strings.Contains(out+stderr, secret) {
		t.Errorf("the refusal repeats the planted password: %s", stderr)
	}
}
