package faults_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// tmpfs mounts a tmpfs of size at a fresh directory, unmounted at cleanup,
// and returns the directory and a remount function. Mounting needs root:
// without it the test is skipped on a laptop and fails in CI.
func tmpfs(t *testing.T, size string) (dir string, remount func(opts string)) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("cannot mount a tmpfs (needs root): %v %s", err, out)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("unmounting the tmpfs: %v %s", err, out)
		}
	})
	t.Logf("mounted a tmpfs of %s for the sinks", size)
	return dir, func(opts string) {
		t.Helper()
		if out, err := exec.Command("mount", "-o", "remount,"+opts, dir).CombinedOutput(); err != nil {
			t.Fatalf("remount %s: %v %s", opts, err, out)
		}
		t.Logf("remounted the tmpfs %s", opts)
	}
}

// used is how many bytes the filesystem at dir holds.
func used(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// Fault 13. A file sink and a bleve index live on a tmpfs, which is then
// shrunk (remount with a size) to about 256 KiB above what it holds, and
// documents of 8 KiB are written: the sinks' calls fail with ENOSPC, the
// worker keeps each cursor where it was and retries, nothing is parked, and
// once the tmpfs is grown again both sinks catch up and hold exactly the
// feed (I1), no key back in the file's lines (I2). A read-only remount is
// not tried: the kernel refuses it while the sinks hold files open for
// writing ("mount point is busy"), and a read-only bind mount over the
// directory would hide it from new opens only.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A longer lease than the other tests': each sink call is cut at half
	// the margin, and a bleve batch of large documents under the race
	// detector on a loaded machine can take longer than the default 350ms.
	e.lease = feed.LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 4 * time.Second}
	dir, remount := tmpfs(t, "16m")
	targets := []*target{fileTarget(t, filepath.Join(dir)), bleveTarget(t, e.ctx, filepath.Join(dir, "index"), e.allKeys)}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(nil)}
	sinks := []feed.SinkName{"export", "search"}
	w := e.newWorker("A", false, targets, recs, syncer.Options{BatchSize: 100, MoveInterval: -1})
	e.put(0, 200)
	eventually(t, "caught up", 30*time.Second, e.caughtUp(sinks...))

	stuck := func(what string, want error) {
		t.Helper()
		eventually(t, "both sinks failing: "+what, 30*time.Second, func() bool {
			for _, s := range w.runner.States() {
				if s.LastError == nil || !errors.Is(s.LastError, want) {
					return false
				}
			}
			return true
		})
		for _, s := range w.runner.States() {
			t.Logf("%s, %s: %v", what, s.ID.Sink, s.LastError)
		}
		if e.caughtUp("export")() || e.caughtUp("search")() {
			t.Errorf("%s: a cursor moved past records its sink could not write", what)
		}
	}

	// Full: room for about 256 KiB more, then documents of 8 KiB.
	remount(fmt.Sprintf("size=%d", used(t, dir)+256<<10))
	for i := range 4 {
		keys := make([]feed.Key, 50)
		cs := make([]feed.Change, 50)
		for j := range keys {
			keys[j] = key(1000 + i*50 + j)
			cs[j] = e.change(keys[j], false)
			cs[j] = feed.Put(keys[j], bigDoc(cs[j].Doc))
			e.mu.Lock()
			e.last[keys[j]] = cs[j].Doc
			e.mu.Unlock()
		}
		if _, err := e.store.WriteCommitted(e.ctx, e.feed, cs); err != nil {
			t.Fatal(err)
		}
	}
	stuck("full", syscall.ENOSPC)
	began := time.Now()
	remount("size=64m")
	eventually(t, "caught up once there is room", 60*time.Second, e.caughtUp(sinks...))
	t.Logf("caught up %v after the room came back", time.Since(began).Round(time.Millisecond))
	e.checkSinks(t, targets...)
	for _, s := range sinks {
		if p := e.parked(s); len(p) > 0 {
			t.Errorf("%s parked %d records for a fault of the disk", s, len(p))
		}
	}
	checkFileLines(t, filepath.Join(dir, "orders.jsonl"))
	w.stop()
	e.checkReleased(t, sinks...)
}

// bigDoc is d with 8 KiB more padding.
func bigDoc(d []byte) []byte {
	s := string(d)
	return []byte(strings.Replace(s, `"pad":"`, `"pad":"`+strings.Repeat("y", 8<<10), 1))
}
