package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// Fault 13, a full disk. A file sink and a bleve index live on a tmpfs,
// which is then shrunk (remount with a size) to about 256 KiB above what it
// holds, and documents of 8 KiB are written: the sinks' calls fail with
// ENOSPC, the worker keeps each cursor where it was and retries, nothing is
// parked, and once the tmpfs is grown again both sinks catch up and hold
// exactly the feed (I1), no key back in the file's lines nor in the seqs
// read from the index (I2). A read-only disk is TestDiskReadOnly.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A longer lease than the other tests': each sink call is cut at half
	// the margin, and a bleve batch of large documents under the race
	// detector on a loaded machine can take longer than the default 350ms.
	e.lease = feed.LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 4 * time.Second}
	dir, remount := tmpfs(t, "16m")
	targets := []*target{fileTarget(t, filepath.Join(dir)), bleveTarget(t, e.ctx, filepath.Join(dir, "index"), e.allKeys)}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(targets[1].probe)}
	sinks := []feed.SinkName{"export", "search"}
	w := e.newWorker("A", false, targets, recs, syncer.Options{BatchSize: 100, MoveInterval: -1})
	e.put(0, 200)
	eventually(t, "caught up", 30*time.Second, e.caughtUp(sinks...))

	stuck := func(what string, want error) {
		t.Helper()
		// Each failed call is followed by the recorder's probe of the
		// index, which on a full disk can take seconds: a longer wait than
		// the others'.
		deadline := time.Now().Add(90 * time.Second)
		for {
			failing := true
			for _, s := range w.runner.States() {
				if s.LastError == nil || !errors.Is(s.LastError, want) {
					failing = false
				}
			}
			if failing {
				break
			}
			if time.Now().After(deadline) {
				for _, s := range w.runner.States() {
					t.Logf("%s, %s: last error %v", what, s.ID.Sink, s.LastError)
				}
				t.Fatalf("both sinks failing: %s: not within 1m30s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
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
	remount("size=64m")
	e.checkRecovered(t, "a full disk", dir, sinks, targets, recs)
	w.stop()
	e.checkReleased(t, sinks...)
}

// Fault 13, a read-only disk. Linux refuses to remount a filesystem
// read-only while a file on it is open for writing ("mount point is
// busy"), and the sinks keep theirs open as long as they live; a read-only
// bind mount over the directory would refuse new opens only, while the
// sinks went on writing through the files they hold. So the disk turns
// read-only as it does under a daemon that is stopped and started again:
// worker A fills a file sink and a bleve index on a tmpfs, stops, and
// closes both sinks, which lets go of every file; the tmpfs is remounted
// read-only, more changes are written (new keys, new versions and
// deletions), and worker B starts, as the restarted daemon would.
//
// On a read-only disk neither sink can even be built: file.New and
// bleve.New fail with EROFS, taking their lock files. A daemon then fails
// to start, and its service manager starts it again; here each of B's
// sinks is built at its first call, and at each call after while building
// fails (reopening), the same loop in process. So every call B makes is
// an error wrapping EROFS, which the worker retries: both cursors stay
// where A left them, and nothing is parked. Once the tmpfs is remounted
// read-write the next build succeeds and both sinks catch up and hold
// exactly the feed (I1), with no key back in the file's lines nor in the
// seqs read from the index (I2). A sink that parked on EROFS would leave
// the parked list non-empty; one that took EROFS for success would let
// the cursor pass records it never wrote (checked while read-only) and
// end without them (I1).
func TestDiskReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir, remount := tmpfs(t, "16m")
	var mu sync.Mutex
	var built []*reopening
	reopenable := func(tg *target) *target {
		c := *tg
		c.open = func(t testing.TB) feed.Sink {
			r := &reopening{build: tg.build}
			t.Cleanup(r.close)
			mu.Lock()
			built = append(built, r)
			mu.Unlock()
			return r
		}
		return &c
	}
	targets := []*target{reopenable(fileTarget(t, dir)), reopenable(bleveTarget(t, e.ctx, filepath.Join(dir, "index"), e.allKeys))}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(targets[1].probe)}
	sinks := []feed.SinkName{"export", "search"}
	opts := syncer.Options{BatchSize: 100, MoveInterval: -1}
	a := e.newWorker("A", false, targets, recs, opts)
	e.put(0, 200)
	eventually(t, "A caught up", 30*time.Second, e.caughtUp(sinks...))
	a.stop()
	mu.Lock()
	for _, r := range built {
		r.close()
	}
	built = nil
	mu.Unlock()
	before, err := e.store.Describe(e.ctx, e.feed)
	if err != nil {
		t.Fatal(err)
	}

	remount("ro")
	e.put(150, 300)
	e.write([]feed.Key{key(0), key(1), key(2), key(160)}, func(feed.Key) bool { return true })
	b := e.newWorker("B", false, targets, recs, opts)
	// Three failed builds of each sink (or, were the fault taken for
	// success, both cursors at the head, which the checks below report).
	eventually(t, "both sinks failing on the read-only disk", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range built {
			if r.failures() >= 3 {
				n++
			}
		}
		return n == len(sinks) || e.caughtUp(sinks...)()
	})
	for _, s := range b.runner.States() {
		if !errors.Is(s.LastError, syscall.EROFS) {
			t.Errorf("read-only, %s: the worker's last error is %v; want one wrapping EROFS", s.ID.Sink, s.LastError)
		} else {
			t.Logf("read-only, %s: %v", s.ID.Sink, s.LastError)
		}
	}
	after, err := e.store.Describe(e.ctx, e.feed)
	if err != nil {
		t.Fatal(err)
	}
	was := map[feed.SinkName]feed.Cursor{}
	for _, s := range before.Sinks {
		was[s.Sink] = s.Cursor
	}
	for _, s := range after.Sinks {
		if s.Cursor != was[s.Sink] {
			t.Errorf("%s's cursor moved from %v to %v while its disk was read-only", s.Sink, was[s.Sink], s.Cursor)
		}
	}

	remount("rw")
	e.checkRecovered(t, "a read-only disk", dir, sinks, targets, recs)
	b.stop()
	e.checkReleased(t, sinks...)
}

// reopening is a sink built at its first call, and again at each call
// after while building fails, a build's error being the call's: in
// process, a daemon whose start failed on a sink it could not build,
// started again and again by its service manager.
type reopening struct {
	build func() (feed.Sink, func(), error)

	mu    sync.Mutex
	s     feed.Sink
	done  func()
	fails int
}

func (r *reopening) sink() (feed.Sink, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.s == nil {
		s, done, err := r.build()
		if err != nil {
			r.fails++
			return nil, err
		}
		r.s, r.done = s, done
	}
	return r.s, nil
}

func (r *reopening) failures() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fails
}

func (r *reopening) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		r.done()
	}
	r.s, r.done = nil, nil
}

func (r *reopening) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	s, err := r.sink()
	if err != nil {
		return nil, err
	}
	return s.Apply(ctx, recs)
}

func (r *reopening) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	s, err := r.sink()
	if err != nil {
		return nil, err
	}
	return s.OpenResync(ctx, g)
}

// checkRecovered waits, once the disk is back, for the file sink in dir and
// the other sinks to catch up, and checks that they hold the feed (I1),
// parked nothing for what was a fault of the disk, and never took a key
// back (I2: the file's own lines, and each recorder's reads).
func (e *env) checkRecovered(t *testing.T, fault, dir string, sinks []feed.SinkName, targets []*target, recs []*recorder) {
	t.Helper()
	began := time.Now()
	eventually(t, "caught up once the disk is back from "+fault, 60*time.Second, e.caughtUp(sinks...))
	t.Logf("caught up %v after %s", time.Since(began).Round(time.Millisecond), fault)
	e.checkSinks(t, targets...)
	for _, s := range sinks {
		if p := e.parked(s); len(p) > 0 {
			t.Errorf("%s parked %d records for %s", s, len(p), fault)
		}
	}
	checkFileLines(t, filepath.Join(dir, "orders.jsonl"))
	for i, r := range recs {
		r.checkNoRegress(t, targets[i].name)
	}
}

// bigDoc is d with 8 KiB more padding.
func bigDoc(d []byte) []byte {
	s := string(d)
	return []byte(strings.Replace(s, `"pad":"`, `"pad":"`+strings.Repeat("y", 8<<10), 1))
}
