package bleve

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"

	"github.com/blevesearch/bleve/v2"
	index "github.com/blevesearch/bleve_index_api"
	bolt "go.etcd.io/bbolt"

	"github.com/kairos-es/kairos/feed"
)

// Searcher reads the live index of a sink's directory, following each
// publish: every call runs against the index live when it starts, and runs
// to its end on that index even if a publish retires it meanwhile (the old
// index is closed and removed only once the last such call returns).
//
// A Searcher shares the directory with the sinks of its process (see
// "One process per directory" in the package doc), so it learns of a publish
// the moment it happens, without reading the pointer file again: the
// publishing sink hands the new index to the shared directory, and the next
// call takes it from there. It is safe for concurrent use.
type Searcher struct {
	r      *root
	closed atomic.Bool
}

// NewSearcher opens the directory dir, which must hold an index already (a
// sink's New creates one). A directory another process has open is
// ErrLocked after DefaultLockTimeout.
func NewSearcher(dir string) (*Searcher, error) {
	if dir == "" {
		return nil, feed.Invalid("bleve.dir", "must be set")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, feed.Invalid("bleve.dir", "%q cannot be made absolute: %v", dir, err)
	}
	abs = filepath.Clean(abs)
	roots.Lock()
	defer roots.Unlock()
	if r := roots.m[abs]; r != nil {
		r.refs++
		return &Searcher{r: r}, nil
	}
	r, err := loadRoot(abs, nil, DefaultLockTimeout, false)
	if err != nil {
		return nil, err
	}
	r.refs = 1
	roots.m[abs] = r
	return &Searcher{r: r}, nil
}

// Search runs req against the live index. Ask for SourceField in req.Fields
// to have each hit's document, as the feed handed it out, in its Fields.
func (s *Searcher) Search(ctx context.Context, req *bleve.SearchRequest) (*bleve.SearchResult, error) {
	ix, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.r.put(ix)
	var res *bleve.SearchResult
	err = ix.use(func(idx bleve.Index) (err error) {
		res, err = idx.SearchInContext(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bleve: searching %s: %w", ix.name, err)
	}
	return res, nil
}

// Document returns the live document of key, byte for byte as the feed
// handed it out; ok is false when the index has none.
func (s *Searcher) Document(ctx context.Context, key feed.Key) (doc json.RawMessage, ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	ix, err := s.acquire()
	if err != nil {
		return nil, false, err
	}
	defer s.r.put(ix)
	found := false
	err = ix.use(func(idx bleve.Index) error {
		d, err := idx.Document(string(key))
		if err != nil || d == nil {
			return err
		}
		found = true
		d.VisitFields(func(f index.Field) {
			if f.Name() == SourceField {
				doc = append(json.RawMessage(nil), f.Value()...)
			}
		})
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("bleve: reading %q from %s: %w", key, ix.name, err)
	}
	if !found {
		return nil, false, nil
	}
	if doc == nil {
		return nil, false, fmt.Errorf("bleve: %q in %s has no %s field; the index was not written by this sink", key, ix.name, SourceField)
	}
	return doc, true, nil
}

// Seqs returns the seq the live index's guard holds for each of keys:
// that of the key's document, or of its deletion for a key deleted since
// (see "Writes and the seq guard" in the package doc). Keys the index never
// took are left out. It is what a record must be at or above to change
// the key, so it only ever rises, publishes aside: an auditor reads it to
// check that no key went back, a consumer to tell which version it holds.
func (s *Searcher) Seqs(ctx context.Context, keys ...feed.Key) (map[feed.Key]feed.Seq, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ix, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.r.put(ix)
	out := make(map[feed.Key]feed.Seq, len(keys))
	err = ix.seqs.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(seqsBucket)
		for _, k := range keys {
			if v := b.Get([]byte(k)); len(v) == 8 {
				out[k] = feed.Seq(binary.BigEndian.Uint64(v))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bleve: reading the seqs of %s: %w", ix.name, err)
	}
	return out, nil
}

// DocCount is the number of documents the live index holds.
func (s *Searcher) DocCount() (uint64, error) {
	ix, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer s.r.put(ix)
	var n uint64
	err = ix.use(func(idx bleve.Index) (err error) {
		n, err = idx.DocCount()
		return err
	})
	return n, err
}

// Close releases the searcher; see Sink.Close. Safe to call more than once.
func (s *Searcher) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.r.release()
}

// acquire is root.acquire, refused once the searcher is closed.
func (s *Searcher) acquire() (*indexDir, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return s.r.acquire()
}
