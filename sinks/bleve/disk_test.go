package bleve_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kairos-es/kairos/feed"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

// tmpfs mounts a tmpfs of size at a fresh directory, unmounted at cleanup,
// and returns it with a remount function. Mounting needs root: without it
// the test is skipped on a laptop and fails in CI.
func tmpfs(t *testing.T, size string) (dir string, remount func(opts string)) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
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
	return dir, func(opts string) {
		t.Helper()
		if out, err := exec.Command("mount", "-o", "remount,"+opts, dir).CombinedOutput(); err != nil {
			t.Fatalf("remount %s: %v %s", opts, err, out)
		}
	}
}

func usedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// A batch bleve fails on a full disk: the disk has room for the batch's
// few seqs but not for its segment, so the failure is bleve's own, after it
// made the segment live in memory. bleve then closes that segment under its
// live snapshot, and a read of the index would panic; the sink opens the
// index again from its files instead. So the Apply is an error (the worker
// retries it), every document written before still reads back, by key and
// by search, the failed batch's documents are not served, and once the disk
// has room the same batch lands and stays across a reopen of the directory.
func TestBatchFailsOnAFullDisk(t *testing.T) {
	dir, remount := tmpfs(t, "16m")
	opts := kbleve.Options{Dir: dir}
	s := newSinkNoCleanup(t, opts)
	r, err := kbleve.NewSearcher(dir)
	if err != nil {
		t.Fatal(err)
	}
	closeAll := func() {
		t.Helper()
		if err := r.Close(); err != nil {
			t.Errorf("closing the searcher: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("closing the sink: %v", err)
		}
	}
	defer func() { closeAll() }() // a second Close of either is a no-op

	want := map[feed.Key]json.RawMessage{}
	var before []feed.Record
	for i := range 20 {
		rc := rec(fmt.Sprintf("k%03d", i), feed.Seq(i+1), fmt.Sprintf(`{"n": %d, "title": "before the disk filled"}`, i))
		before = append(before, rc)
		want[rc.Key] = rc.Doc
	}
	applyOK(t, s, before...)

	big := strings.Repeat("x", 16<<10)
	var batch []feed.Record
	for i := range 40 {
		batch = append(batch, rec(fmt.Sprintf("b%03d", i), feed.Seq(100+i), fmt.Sprintf(`{"n": %d, "body": %q}`, i, big)))
	}
	// Room for the seq file's few pages, not for 640 KiB of documents.
	remount(fmt.Sprintf("size=%d", usedBytes(t, dir)+64<<10))
	_, err = s.Apply(t.Context(), batch)
	if err == nil {
		t.Fatal("Apply of 640 KiB with 64 KiB free: no error")
	}
	if !strings.Contains(err.Error(), "writing a batch") {
		t.Fatalf("Apply failed before bleve's batch (%v); the test needs the batch itself to fail", err)
	}
	t.Logf("on the full disk: %v", err)

	check := func(when string, want map[feed.Key]json.RawMessage) {
		t.Helper()
		for k, d := range want {
			got, ok, err := r.Document(t.Context(), k)
			if err != nil || !ok || string(got) != string(d) {
				t.Fatalf("%s: Document(%s) = %.60s, %v, %v; want %.60s", when, k, got, ok, err, d)
			}
		}
		all, err := contents(t.Context(), r)
		if err != nil {
			t.Fatalf("%s: searching: %v", when, err)
		}
		if len(all) != len(want) {
			t.Fatalf("%s: a search finds %d documents, want %d", when, len(all), len(want))
		}
		n, err := r.DocCount()
		if err != nil || int(n) != len(want) {
			t.Fatalf("%s: DocCount = %d, %v; want %d", when, n, err, len(want))
		}
	}
	check("after the failed batch", want)

	remount("size=64m")
	applyOK(t, s, batch...)
	for _, rc := range batch {
		want[rc.Key] = rc.Doc
	}
	check("after the batch was sent again", want)

	closeAll()
	s = newSink(t, opts)
	r = newSearcher(t, dir)
	check("after the directory was opened again", want)
}
