package faults_test

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-es/kairos/internal/pgtest"
)

// The daemon tests run the real command, `kairos run`, built once for the
// package from this module's cmd/kairos into binDir.
var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

func kairosBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			binError = fmt.Errorf("no go command to build kairos with: %w", err)
			return
		}
		binDir, err = os.MkdirTemp("", "kairos-faults-")
		if err != nil {
			binError = err
			return
		}
		binPath = filepath.Join(binDir, "kairos")
		out, err := exec.Command(goBin, "build", "-o", binPath, "github.com/kairos-es/kairos/cmd/kairos").CombinedOutput()
		if err != nil {
			binError = fmt.Errorf("building kairos: %v\n%s", err, out)
		}
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}

// daemon is one `kairos run` subprocess; start it again after a kill with
// start.
type daemon struct {
	t    testing.TB
	name string
	cfg  string
	app  string // the application_name of its feed database sessions

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan error
	logs  bytes.Buffer
	lives int
}

// withApp is u with application_name set to app.
func withApp(t testing.TB, u, app string) string {
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set("application_name", app)
	p.RawQuery = q.Encode()
	return p.String()
}

// newDaemon writes name's configuration from body, which may use {{db}}
// (the feed database's URL, with the daemon's application name), {{app}}
// (that name, for a sink's URL to carry it too, suffixed), {{listen}} (an
// address of its own) and {{name}}.
func newDaemon(t testing.TB, name, dbURL, body string) *daemon {
	t.Helper()
	d := &daemon{t: t, name: name, app: "kfaults_" + name + "_" + randHex()}
	body = strings.NewReplacer("{{db}}", withApp(t, dbURL, d.app), "{{listen}}", pgtest.ClosedPort(t), "{{name}}", name, "{{app}}", d.app).Replace(body)
	d.cfg = filepath.Join(t.TempDir(), "kairos.yaml")
	if err := os.WriteFile(d.cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("--- daemon %s log (last 4 KiB):\n%s", d.name, d.tail(4096))
		}
	})
	return d
}

func (d *daemon) tail(n int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.logs.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

type lockedWriter struct{ d *daemon }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.logs.Write(p)
}

// start runs the daemon (again).
func (d *daemon) start() {
	d.t.Helper()
	cmd := exec.Command(kairosBinary(d.t), "run", "-c", d.cfg)
	cmd.Stdout, cmd.Stderr = lockedWriter{d}, lockedWriter{d}
	fmt.Fprintf(lockedWriter{d}, "=== start %d\n", d.lives+1)
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("starting daemon %s: %v", d.name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	d.mu.Lock()
	d.cmd, d.done = cmd, done
	d.lives++
	d.mu.Unlock()
}

func (d *daemon) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd != nil
}

func (d *daemon) signal(s syscall.Signal) {
	d.mu.Lock()
	cmd := d.cmd
	d.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(s)
	}
}

// kill SIGKILLs the daemon and waits for it; a stopped one stays stopped.
func (d *daemon) kill() {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
}

// term SIGTERMs the daemon and fails the test unless it exits 0 within 20s.
func (d *daemon) term() {
	d.t.Helper()
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			d.t.Errorf("daemon %s after SIGTERM: %v", d.name, err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		d.t.Errorf("daemon %s still ran 20s after SIGTERM", d.name)
	}
}

// sessionsLeft counts the database sessions of the daemons, by application
// name: none may outlive a daemon that stopped (I6). A backend whose client
// has just gone may show for a moment more while it exits, so it waits up to
// 10s for the count to reach 0.
func (e *env) sessionsLeft(ds ...*daemon) int {
	apps := make([]string, len(ds))
	for i, d := range ds {
		apps[i] = d.app + "%"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE ANY ($1)`, apps).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sinkURL is u for a daemon's PostgreSQL sink: its sessions carry the
// daemon's application name, suffixed _sink (the placeholder survives
// until newDaemon fills it in).
func sinkURL(u string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "application_name={{app}}_sink"
}
