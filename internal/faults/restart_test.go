package faults_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/file"
)

// cluster is a private PostgreSQL cluster a test starts, restarts and
// removes: never the shared server.
type cluster struct {
	t    testing.TB
	bin  string
	dir  string
	port string
	URL  string
}

// privateCluster initdbs a cluster as user postgres in a fresh directory and
// starts it on a spare port, listening on 127.0.0.1 only. It needs root (to
// act as postgres) and a PostgreSQL installation: without them the test is
// skipped on a laptop and fails in CI.
func privateCluster(t testing.TB) *cluster {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		unavailable("a private PostgreSQL cluster needs root, to run initdb as user postgres")
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		unavailable("no PostgreSQL installation to initdb a private cluster with")
	}
	sort.Strings(bins)
	dir, err := os.MkdirTemp("", "kfaults-pg-")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(listenAddr(t))
	c := &cluster{t: t, bin: filepath.Dir(bins[len(bins)-1]), dir: dir, port: port}
	c.URL = "postgres://postgres@127.0.0.1:" + port + "/postgres"
	t.Cleanup(func() {
		_, _ = c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
		os.RemoveAll(dir)
	})
	if out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput(); err != nil {
		unavailable("chown of the cluster's directory to postgres: %v %s", err, out)
	}
	if out, err := c.run("initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	if out, err := c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(dir, "log"), "-w", "-o",
		"-p "+port+" -k "+dir+" -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60", "start"); err != nil {
		t.Fatalf("starting the private cluster: %v\n%s", err, out)
	}
	t.Logf("private cluster %s on port %s", filepath.Base(c.bin[:len(c.bin)-4]), port)
	return c
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs one of the cluster's tools as user postgres and returns its
// output. The output goes through a file, not a pipe: the server pg_ctl
// starts inherits the command's descriptors, and a pipe it held open would
// keep the command from ever being waited for.
func (c *cluster) run(tool string, args ...string) ([]byte, error) {
	out, err := os.CreateTemp(c.dir, "out-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(c.bin, tool)}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	return b, err
}

// restart restarts the cluster with pg_ctl's shutdown mode (fast:
// sessions ended, a checkpoint; immediate: no checkpoint, crash recovery at
// start).
func (c *cluster) restart(mode string) {
	c.t.Helper()
	began := time.Now()
	if out, err := c.run("pg_ctl", "-D", c.data(), "-m", mode, "-w", "restart"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		c.t.Fatalf("pg_ctl restart -m %s: %v\n%s\n%s", mode, err, out, log)
	}
	c.t.Logf("PostgreSQL restarted -m %s in %v", mode, time.Since(began).Round(time.Millisecond))
}

// listenAddr is a free address on 127.0.0.1.
func listenAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Fault 8. A `kairos run` daemon mirrors a feed on a private PostgreSQL
// cluster into a table of that same cluster and a file, while a writer
// commits 20 changes every 50ms (a failed commit is retried as a new
// version). The cluster is restarted twice under that load, `pg_ctl restart
// -m fast` and then `-m immediate` (crash recovery). The daemon recovers by
// itself, the same process throughout: once the writer stops, both sinks
// hold exactly the feed (I1), every committed row below the cursor was
// applied (I3, the cursor at the head with I1), holders and the generation
// never repeat or go back (I5, the watcher), and it stops cleanly (I6).
func TestPostgresRestartUnderLoad(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	e := newEnvAt(t, c.URL, 150*time.Second)
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	body := fmt.Sprintf(daemonBody, e.schema, sinkURL(c.URL), "target", path)
	d := newDaemon(t, "A", c.URL, body)
	d.start()
	sinks := []feed.SinkName{"table", "export"}
	e.put(0, 100)
	eventually(t, "caught up", 60*time.Second, e.caughtUp(sinks...))
	w := e.watch(e.pool, `target.orders`)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var commits, failures int
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for {
				keys := make([]feed.Key, 20)
				for j := range keys {
					keys[j] = key((i*20 + j) % 2000)
				}
				cs := make([]feed.Change, len(keys))
				for j, k := range keys {
					cs[j] = e.change(k, j%7 == 0)
				}
				if _, err := e.store.WriteCommitted(e.ctx, e.feed, cs); err == nil {
					commits++
					break
				}
				failures++
				time.Sleep(100 * time.Millisecond)
				if e.ctx.Err() != nil {
					return
				}
			}
		}
	})
	time.Sleep(2 * time.Second)
	c.restart("fast")
	time.Sleep(3 * time.Second)
	c.restart("immediate")
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d commits, %d failed attempts retried", commits, failures)
	eventually(t, "caught up after the restarts", 90*time.Second, e.caughtUp(sinks...))
	w.stop(t)
	want, _ := live(e.ctx, t, e.store, e.feed)
	sameDocs(t, "the table", readTable(t, e, "target"), want, nil)
	snap, err := file.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameDocs(t, "the file", snap.Docs, want, nil)
	checkFileLines(t, path)
	if d.lives != 1 || !d.running() {
		t.Errorf("the daemon was restarted or stopped (%d starts); it must recover by itself", d.lives)
	}
	d.term()
	e.checkReleased(t, sinks...)
	if n := e.sessionsLeft(d); n != 0 {
		t.Errorf("I6: %d database sessions of the stopped daemon are left", n)
	}
}
