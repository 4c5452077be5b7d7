package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kairos-es/kairos/feed"
)

// dirSink mirrors a feed into a directory of JSON files, one per key: a small
// but complete feed.Sink, written the way feed.Sink's doc asks.
//
// The copy readers are served is the directory the symlink "current" points
// to. A resync fills a fresh directory beside it, and Publish swaps the
// symlink with one rename, which is atomic: a reader that opens files through
// "current" sees the old copy or the new one, never a mix or an empty one.
// Keys are escaped into file names reversibly (url.PathEscape), or hashed when
// the escaped name would pass the file system's 255-byte limit.
//
// It keeps no seq guard (it stores documents only), which its doc would say
// if it were a package: a stale call from a worker that lost its lease could
// write an older version back. It rejects, for the record's own sake, a
// product without a name, as a search index would refuse a document it cannot
// index.
type dirSink struct {
	root string
}

// newDirSink makes root hold an empty live copy, unless it holds one.
func newDirSink(root string) (*dirSink, error) {
	s := &dirSink{root: root}
	if _, err := os.Stat(s.current()); errors.Is(err, fs.ErrNotExist) {
		dir, err := s.freshDir("empty")
		if err != nil {
			return nil, err
		}
		if err := s.point(dir); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *dirSink) current() string { return filepath.Join(s.root, "current") }

// Apply writes to the live copy; see feed.Sink.
func (s *dirSink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	dir, err := filepath.EvalSymlinks(s.current())
	if err != nil {
		return nil, err
	}
	return apply(ctx, dir, records)
}

// apply writes records into dir: a sink-wide fault (the disk) is an error,
// a product the sink will not serve a rejection.
func apply(ctx context.Context, dir string, records []feed.Record) ([]feed.Rejection, error) {
	var rejected []feed.Rejection
	for _, r := range records {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, fileName(r.Key))
		if r.Deleted() {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			continue
		}
		var p struct{ Name string }
		if json.Unmarshal(r.Doc, &p) != nil || p.Name == "" {
			rejected = append(rejected, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "a product needs a name to be listed"})
			// A key whose new version is refused must not keep serving its
			// old one.
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			continue
		}
		// Write, then rename: a reader never sees half a file.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, r.Doc, 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, err
		}
	}
	return rejected, nil
}

// OpenResync fills a fresh directory; see feed.Sink. Each resync gets a
// directory of its own, so one that a crash left half-filled is never reused.
func (s *dirSink) OpenResync(_ context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	if g < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", g)
	}
	dir, err := s.freshDir(fmt.Sprintf("g%d", g))
	if err != nil {
		return nil, err
	}
	return &dirResync{s: s, dir: dir}, nil
}

func (s *dirSink) freshDir(name string) (string, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	dir := filepath.Join(s.root, name+"-"+hex.EncodeToString(b[:]))
	return dir, os.MkdirAll(dir, 0o755)
}

// point swaps "current" to dir in one rename and removes the copy it
// pointed to before.
func (s *dirSink) point(dir string) error {
	old, _ := filepath.EvalSymlinks(s.current())
	tmp := s.current() + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(dir), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.current()); err != nil {
		return err
	}
	if old != "" && old != dir {
		return os.RemoveAll(old)
	}
	return nil
}

// Documents reads the live copy, for printing: key → document.
func (s *dirSink) Documents() (map[string]string, error) {
	entries, err := os.ReadDir(s.current())
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		key, err := url.PathUnescape(name)
		if err != nil {
			key = name // a hashed name
		}
		b, err := os.ReadFile(filepath.Join(s.current(), e.Name()))
		if err != nil {
			return nil, err
		}
		out[key] = string(b)
	}
	return out, nil
}

// Listing is the live copy, one "key = document" line each, in key order.
func (s *dirSink) Listing() ([]string, error) {
	docs, err := s.Documents()
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = k + " = " + docs[k]
	}
	return lines, nil
}

type dirResync struct {
	s   *dirSink
	dir string
}

func (r *dirResync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	return apply(ctx, r.dir, records)
}

func (r *dirResync) Publish(context.Context) error { return r.s.point(r.dir) }

func (r *dirResync) Abort(context.Context) error { return os.RemoveAll(r.dir) }

// fileName escapes key into a file name, reversibly while it fits.
func fileName(key feed.Key) string {
	name := url.PathEscape(string(key))
	if len(name) > 200 {
		sum := sha256.Sum256([]byte(key))
		name = "sha256-" + hex.EncodeToString(sum[:])
	}
	return name + ".json"
}
