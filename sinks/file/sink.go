package file

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of Options.
const (
	DefaultCompactRatio    = 4
	DefaultCompactMinLines = 10_000
)

// Options configure a Sink. Path is required.
type Options struct {
	// Path is the live file. Its directory must exist; the file is created
	// (with a header for generation 0) when it does not. Required.
	Path string
	// MaxDocumentBytes bounds a document, in bytes of its JSON; a larger one
	// is rejected. 0: no bound of the sink's own.
	MaxDocumentBytes int
	// CompactRatio and CompactMinLines say when Apply compacts the file:
	// once it holds more than CompactRatio lines per key and at least
	// CompactMinLines lines. Defaults DefaultCompactRatio (at least 2) and
	// DefaultCompactMinLines.
	CompactRatio    int
	CompactMinLines int
}

// Sink writes a feed into one JSON-lines file; see the package doc.
type Sink struct {
	opts Options
	lock *os.File // Path+".lock", flocked around every step

	mu   sync.Mutex // serializes this value's calls, and guards live
	live *copyState
}

// copyState is what a process knows of one copy: the seq each key holds,
// read up to offset of the file it identifies.
type copyState struct {
	path   string
	fi     os.FileInfo // the file folded; another one (a rename over path) means fold again
	offset int64
	gen    feed.Generation
	floor  feed.Seq // the header's: records below it are refused
	seqs   map[feed.Key]feed.Seq
	lines  int
}

// New opens (creating when absent) the file at opts.Path and reads it.
func New(opts Options) (*Sink, error) {
	const p = "options."
	switch {
	case opts.Path == "":
		return nil, feed.Invalid(p+"path", "must not be empty")
	case opts.MaxDocumentBytes < 0:
		return nil, feed.Invalid(p+"max_document_bytes", "is %d; want 0 (no bound) or more", opts.MaxDocumentBytes)
	case opts.CompactRatio < 0 || opts.CompactRatio == 1:
		return nil, feed.Invalid(p+"compact_ratio", "is %d; want 2 or more (0 for the default %d)", opts.CompactRatio, DefaultCompactRatio)
	case opts.CompactMinLines < 0:
		return nil, feed.Invalid(p+"compact_min_lines", "is %d; want 0 or more", opts.CompactMinLines)
	}
	if opts.CompactRatio == 0 {
		opts.CompactRatio = DefaultCompactRatio
	}
	if opts.CompactMinLines == 0 {
		opts.CompactMinLines = DefaultCompactMinLines
	}
	dir := filepath.Dir(opts.Path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, feed.Invalid(p+"path", "names a file in %s, which is not a directory that exists", dir)
	}
	lock, err := os.OpenFile(opts.Path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	s := &Sink{opts: opts, lock: lock}
	err = s.locked(func() error {
		if _, err := os.Stat(opts.Path); errors.Is(err, os.ErrNotExist) {
			if err := writeFresh(opts.Path, 0); err != nil {
				return err
			}
		}
		s.live = &copyState{path: opts.Path}
		return s.live.catchUp(nil)
	})
	if err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the lock file. The sink is not used afterwards.
func (s *Sink) Close() error { return s.lock.Close() }

// MaxDocumentBytes is Options.MaxDocumentBytes.
func (s *Sink) MaxDocumentBytes() int { return s.opts.MaxDocumentBytes }

// locked runs f holding this value's mutex and the file lock.
func (s *Sink) locked(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := flock(s.lock, false); err != nil {
		return fmt.Errorf("locking %s: %w", s.lock.Name(), err)
	}
	defer flock(s.lock, true)
	return f()
}

// writeFresh writes an empty copy at path for generation g: header only,
// fsynced, replacing what was there.
func writeFresh(path string, g feed.Generation) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(headerLine(g, 0)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// catchUp folds what was written to the copy since this process last read
// it (all of it, when the file was replaced), keeping f open when given.
// Under the file lock.
func (c *copyState) catchUp(f *os.File) error {
	if f == nil {
		var err error
		if f, err = os.Open(c.path); err != nil {
			return err
		}
		defer f.Close()
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if c.fi == nil || !os.SameFile(c.fi, fi) || fi.Size() < c.offset {
		c.fi, c.offset, c.seqs, c.lines = fi, 0, map[feed.Key]feed.Seq{}, 0
	}
	c.fi = fi
	if fi.Size() == c.offset {
		return nil
	}
	if _, err := f.Seek(c.offset, io.SeekStart); err != nil {
		return err
	}
	h, end, err := fold(f, c.offset, func(l line, _ []byte) {
		c.lines++
		if l.Seq > c.seqs[l.Key] {
			c.seqs[l.Key] = l.Seq
		}
	})
	if err != nil {
		return fmt.Errorf("reading %s: %w", c.path, err)
	}
	if c.offset == 0 {
		c.gen, c.floor = h.Generation, h.Floor
	}
	c.offset = end
	return nil
}

// apply appends the records above the guard to the copy, under the file
// lock: it folds what others appended first, drops an unfinished last line
// a crashed writer left, appends, fsyncs.
func (s *Sink) apply(c *copyState, records []feed.Record, resync bool) ([]feed.Rejection, error) {
	f, err := os.OpenFile(c.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := c.catchUp(f); err != nil {
		return nil, err
	}
	if resync && c.floor == 0 && c.lines == 0 && len(records) > 0 {
		// A resync's first batch starts at its generation's lowest seq:
		// record it, so that a stale call of an older generation, landing
		// after this copy is published, cannot add a key it lacks.
		floor := records[0].Seq
		for _, r := range records {
			floor = min(floor, r.Seq)
		}
		hl := headerLine(c.gen, floor)
		if err := f.Truncate(0); err != nil {
			return nil, err
		}
		if _, err := f.WriteAt(hl, 0); err != nil {
			return nil, err
		}
		c.floor, c.offset = floor, int64(len(hl))
	}
	var (
		buf  []byte
		rejs []feed.Rejection
		took = make(map[feed.Key]feed.Seq, len(records))
	)
	for _, r := range records {
		if max := s.opts.MaxDocumentBytes; max > 0 && len(r.Doc) > max {
			rejs = append(rejs, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: fmt.Sprintf("the document is %d bytes; this file sink takes at most %d", len(r.Doc), max)})
			continue
		}
		if r.Seq <= max(c.seqs[r.Key], took[r.Key]) || r.Seq < c.floor {
			continue // the guard: the file holds this version or a newer one, or the record is of an older generation
		}
		if buf, err = appendRecord(buf, r); err != nil {
			return nil, err
		}
		took[r.Key] = r.Seq
	}
	if len(buf) == 0 {
		return rejs, nil
	}
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if fi.Size() > c.offset {
		// A writer died mid-line; no one writes now (we hold the lock).
		if err := f.Truncate(c.offset); err != nil {
			return nil, err
		}
	}
	if _, err := f.WriteAt(buf, c.offset); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	c.fi, c.offset = fi, c.offset+int64(len(buf))
	for k, q := range took {
		c.seqs[k] = q
		c.lines++
	}
	return rejs, nil
}

// Apply writes records to the live file; see the package doc.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rejs []feed.Rejection
	err := s.locked(func() error {
		var err error
		if rejs, err = s.apply(s.live, records, false); err != nil {
			return err
		}
		if s.live.lines >= s.opts.CompactMinLines && s.live.lines > s.opts.CompactRatio*len(s.live.seqs) {
			return s.compact(s.live)
		}
		return nil
	})
	return rejs, err
}

// compact rewrites the copy with its latest line per key (tombstones kept,
// for the guard), in seq order, and renames it over the copy. Under the file
// lock.
func (s *Sink) compact(c *copyState) error {
	f, err := os.Open(c.path)
	if err != nil {
		return err
	}
	defer f.Close()
	type kept struct {
		seq feed.Seq
		raw []byte
	}
	latest := map[feed.Key]kept{}
	h, _, err := fold(f, 0, func(l line, raw []byte) {
		if k, ok := latest[l.Key]; !ok || l.Seq > k.seq {
			latest[l.Key] = kept{seq: l.Seq, raw: raw}
		}
	})
	if err != nil {
		return fmt.Errorf("compacting %s: %w", c.path, err)
	}
	all := make([]kept, 0, len(latest))
	for _, k := range latest {
		all = append(all, k)
	}
	slices.SortFunc(all, func(a, b kept) int { return cmp.Compare(a.seq, b.seq) })
	var out bytes.Buffer
	out.Write(headerLine(h.Generation, h.Floor))
	for _, k := range all {
		out.Write(k.raw)
	}
	tmp := c.path + ".compact.tmp"
	if err := writeSynced(tmp, out.Bytes()); err != nil {
		return err
	}
	if err := replace(tmp, c.path); err != nil {
		return err
	}
	c.fi = nil // fold the rewrite afresh
	return c.catchUp(nil)
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replace renames from over to and fsyncs the directory, so the rename
// survives a crash: a reader opening to gets one copy or the other, whole.
func replace(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(to))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// OpenResync starts a fresh copy for generation g, empty whatever an earlier
// resync of g left; see the package doc.
func (s *Sink) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	if g < 1 {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", g)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := &target{s: s, c: &copyState{path: s.opts.Path + ".g" + strconv.FormatInt(int64(g), 10) + ".tmp"}}
	err := s.locked(func() error {
		if err := writeFresh(t.c.path, g); err != nil {
			return err
		}
		return t.c.catchUp(nil)
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

type target struct {
	s *Sink
	c *copyState
}

func (t *target) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rejs []feed.Rejection
	err := t.s.locked(func() error {
		var err error
		rejs, err = t.s.apply(t.c, records, true)
		return err
	})
	return rejs, err
}

// SetFloor gives a copy that was sent no record its floor, in its header as
// a first batch's is; see feed.FloorSetter. A copy that already holds
// records keeps its header: SetFloor then fails, changing nothing.
func (t *target) SetFloor(ctx context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return t.s.locked(func() error {
		f, err := os.OpenFile(t.c.path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := t.c.catchUp(f); err != nil {
			return err
		}
		if t.c.lines > 0 {
			return fmt.Errorf("setting the floor of %s: the copy already holds records", t.c.path)
		}
		hl := headerLine(t.c.gen, floor)
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.WriteAt(hl, 0); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		t.c.floor, t.c.offset = floor, int64(len(hl))
		return nil
	})
}

// Publish renames the copy over the live file; see the package doc.
func (t *target) Publish(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return t.s.locked(func() error {
		if err := t.c.catchUp(nil); err != nil {
			return fmt.Errorf("publishing: %w", err)
		}
		if err := replace(t.c.path, t.s.opts.Path); err != nil {
			return err
		}
		t.s.live = &copyState{path: t.s.opts.Path}
		return t.s.live.catchUp(nil)
	})
}

// Abort removes the copy, leaving the live file as it is.
func (t *target) Abort(ctx context.Context) error {
	return t.s.locked(func() error {
		if err := os.Remove(t.c.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
}
