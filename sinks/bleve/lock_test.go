//go:build unix

package bleve_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

// TestLockedByAnotherProcess: while another process holds the directory's
// lock (an flock on a file opened apart, which conflicts as another
// process's would), New waits LockTimeout and gives up with ErrLocked; once
// it lets go, New opens the directory.
func TestLockedByAnotherProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newSinkNoCleanup(t, kbleve.Options{Dir: dir})
	applyOK(t, s, rec("a", 1, `1`))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = kbleve.New(t.Context(), kbleve.Options{Dir: dir, LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, kbleve.ErrLocked) {
		t.Fatalf("New on a locked directory: %v; want ErrLocked", err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("New gave up after %v, before its lock timeout", waited)
	}
	if _, err := kbleve.NewSearcher(dir); !errors.Is(err, kbleve.ErrLocked) {
		t.Errorf("NewSearcher on a locked directory: %v; want ErrLocked", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	newSink(t, kbleve.Options{Dir: dir})
}
