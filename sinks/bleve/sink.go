package bleve

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/document"
	"github.com/blevesearch/bleve/v2/mapping"
	index "github.com/blevesearch/bleve_index_api"
	bolt "go.etcd.io/bbolt"

	"github.com/kairos-es/kairos/feed"
)

// SourceField is the stored, unindexed field that holds each document's JSON
// exactly as the feed handed it out. Ask for it in a search request's Fields
// to read hits back whole, or use Searcher.Document.
const SourceField = "_source"

// ValueField is the field a document that is not a JSON object (a string, a
// number, an array) is indexed under.
const ValueField = "value"

// DefaultMapping is the mapping a zero Options.Mapping means: bleve's dynamic
// mapping, every field indexed by its JSON type, without storing each field:
// the document is stored whole in SourceField already.
func DefaultMapping() mapping.IndexMapping {
	m := bleve.NewIndexMapping()
	m.StoreDynamic = false
	return m
}

// Sink mirrors a feed into a bleve index on local disk; the package doc
// states what it guarantees. It is safe for concurrent use.
type Sink struct {
	c      *config
	r      *root
	closed atomic.Bool
}

var _ feed.Sink = (*Sink)(nil)

// New returns a sink over the directory opts names, having opened its live
// index (or created the directory and an empty index when there is none).
// Invalid options are an *feed.InvalidError naming the field; a directory
// another process has open is ErrLocked once opts.LockTimeout has passed; a
// damaged directory (a pointer naming no index, an index bleve cannot open)
// is an error saying which.
func New(ctx context.Context, opts Options) (*Sink, error) {
	c, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := openRoot(c)
	if err != nil {
		return nil, err
	}
	return &Sink{c: c, r: r}, nil
}

// Dir is the sink's directory, absolute.
func (s *Sink) Dir() string { return s.c.dir }

// MaxDocumentBytes is the largest document, in bytes of its JSON, the sink
// stores; a larger one is rejected.
func (s *Sink) MaxDocumentBytes() int { return s.c.MaxDocumentBytes }

// Close releases the sink. The directory closes with the last Sink or
// Searcher of this process that has it open; the live index stays on disk.
// Call it once the sink's calls have returned. Safe to call more than once.
func (s *Sink) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.r.release()
}

// Apply writes records to the live index as one bleve batch, under the seq
// guard (see the package doc).
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.r.wmu.Lock()
	defer s.r.wmu.Unlock()
	ix, err := s.r.acquire()
	if err != nil {
		return nil, err
	}
	defer s.r.put(ix)
	return s.apply(ctx, ix, records)
}

// OpenResync creates a fresh index directory for generation, after throwing
// away every unpublished one (a crashed resync's, or that of a worker that has
// since lost its lease).
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < 1 {
		return nil, feed.Invalid("generation", "is %d; it must be 1 or more", generation)
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.r.wmu.Lock()
	defer s.r.wmu.Unlock()
	if s.r.closed {
		return nil, ErrClosed
	}
	for ix := range s.r.building {
		ix.dead = true
		_ = ix.close(true) // swept below if this fails
		delete(s.r.building, ix)
	}
	s.r.sweep()
	ix, err := createIndex(s.r.dir, indexName(generation), s.c.Mapping)
	if err != nil {
		return nil, err
	}
	ix.resync = true
	s.r.building[ix] = true
	return &resync{s: s, ix: ix}, nil
}

// resync is an index being built, in a directory of its own that no reader
// sees until Publish names it in the pointer.
type resync struct {
	s  *Sink
	ix *indexDir
}

func (t *resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	r := t.s.r
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if t.ix.dead || t.s.closed.Load() {
		return nil, fmt.Errorf("bleve: the resync into %s: %w (a newer resync or an Abort threw it away)", t.ix.name, ErrClosed)
	}
	return t.s.apply(ctx, t.ix, records)
}

// SetFloor gives an index that was sent no record its floor, stored in its
// seq file as a first batch's is; see feed.FloorSetter.
func (t *resync) SetFloor(ctx context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r := t.s.r
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if t.ix.dead || t.s.closed.Load() {
		return fmt.Errorf("bleve: setting the floor of %s: %w (a newer resync or an Abort threw it away)", t.ix.name, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(floor))
	if err := t.ix.seqs.Update(func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(floorKey, v[:]) }); err != nil {
		return fmt.Errorf("bleve: writing the floor of %s: %w", t.ix.name, err)
	}
	t.ix.floor = floor
	return nil
}

// Publish names the new index in the pointer file (written to a temporary
// name, synced, renamed over the pointer, the directory synced), then
// serves it to this process's searchers; the old index goes once the last
// search that holds it returns.
func (t *resync) Publish(ctx context.Context) error {
	r := t.s.r
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if t.ix.dead || t.s.closed.Load() {
		return fmt.Errorf("bleve: publishing %s: %w (a newer resync or an Abort threw it away)", t.ix.name, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	renamed, err := r.point(t.ix)
	if renamed {
		// The pointer names the copy: serve it, whatever the directory's
		// sync said, so that memory and disk agree; an Abort after a
		// failed Publish then leaves it alone.
		delete(r.building, t.ix)
		r.swap(t.ix)
	}
	return err
}

// Abort closes and removes the index being built, and nothing else.
func (t *resync) Abort(ctx context.Context) error {
	r := t.s.r
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if t.ix.dead || !r.building[t.ix] {
		return nil // thrown away already, or published
	}
	t.ix.dead = true
	delete(r.building, t.ix)
	return t.ix.close(true)
}

// apply writes records to ix, under r.wmu: the seqs stored for the batch's
// keys are read, records older than them dropped, the new seqs written (and
// synced), then the documents and deletions go to bleve in one batch, which
// returns once bleve has persisted it. Writing the seqs first is what keeps
// the guard across a crash between the two: a seq stored for a document that
// did not land only ever stops an older record, and the worker resends that
// document with the same seq, which the guard lets through (equal is not
// older). A batch bleve fails leaves the index opened again from its files
// (see indexDir.reopen) before the error is returned.
func (s *Sink) apply(ctx context.Context, ix *indexDir, records []feed.Record) ([]feed.Rejection, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(records) == 0 {
		return nil, nil
	}
	var rejected []feed.Rejection
	var failed bleve.Index
	err := ix.use(func(idx bleve.Index) error {
		var err error
		var batchFailed bool
		rejected, batchFailed, err = s.write(ix, idx, records)
		if batchFailed {
			failed = idx
		}
		return err
	})
	if failed != nil {
		if rerr := ix.reopen(failed); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		return nil, err
	}
	return rejected, nil
}

// write is apply's work on idx, the open index of ix; batchFailed says the
// error is bleve's failure of the batch itself.
func (s *Sink) write(ix *indexDir, idx bleve.Index, records []feed.Record) (rejected []feed.Rejection, batchFailed bool, err error) {
	floor := ix.floor
	if ix.resync && floor == 0 {
		floor = records[0].Seq
		for _, rec := range records[1:] {
			floor = min(floor, rec.Seq)
		}
	}
	fresh := make([]bool, len(records))
	err = ix.seqs.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(seqsBucket)
		for i, rec := range records {
			v := b.Get([]byte(rec.Key))
			fresh[i] = rec.Seq >= floor && (len(v) != 8 || feed.Seq(binary.BigEndian.Uint64(v)) <= rec.Seq)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("bleve: reading the seqs of %s: %w", ix.name, err)
	}
	m := idx.Mapping()
	batch := idx.NewBatch()
	for i, rec := range records {
		if !fresh[i] {
			continue
		}
		if rec.Deleted() {
			batch.Delete(string(rec.Key))
			continue
		}
		doc, reason := s.document(m, rec)
		if reason != "" {
			rejected = append(rejected, feed.Rejection{Key: rec.Key, Seq: rec.Seq, Reason: reason})
			fresh[i] = false
			continue
		}
		if err := batch.IndexAdvanced(doc); err != nil {
			rejected = append(rejected, feed.Rejection{Key: rec.Key, Seq: rec.Seq, Reason: "bleve refused the document: " + err.Error()})
			fresh[i] = false
		}
	}
	setFloor := floor != ix.floor
	if batch.Size() == 0 && !setFloor {
		return rejected, false, nil
	}
	// bolt keeps each value Put is given, not a copy, until the
	// transaction commits: every value needs bytes of its own, or every
	// key of the batch would be stored with the last seq written.
	err = ix.seqs.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(seqsBucket)
		if setFloor {
			if err := tx.Bucket(metaBucket).Put(floorKey, binary.BigEndian.AppendUint64(nil, uint64(floor))); err != nil {
				return err
			}
		}
		for i, rec := range records {
			if !fresh[i] {
				continue
			}
			if err := b.Put([]byte(rec.Key), binary.BigEndian.AppendUint64(nil, uint64(rec.Seq))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("bleve: writing the seqs of %s: %w", ix.name, err)
	}
	ix.floor = floor
	if batch.Size() == 0 {
		return rejected, false, nil
	}
	if err := idx.Batch(batch); err != nil {
		return nil, true, fmt.Errorf("bleve: writing a batch to %s: %w", ix.name, err)
	}
	return rejected, false, nil
}

// document builds what bleve indexes for rec: the mapped fields of its JSON
// and the JSON itself, stored whole in SourceField. A reason is returned for
// a document the sink refuses.
func (s *Sink) document(m mapping.IndexMapping, rec feed.Record) (*document.Document, string) {
	if len(rec.Doc) > s.c.MaxDocumentBytes {
		return nil, fmt.Sprintf("the document is %d bytes; the sink stores at most %d (bleve.max_document_bytes)", len(rec.Doc), s.c.MaxDocumentBytes)
	}
	data, err := indexable(rec.Doc)
	if err != nil {
		return nil, "the document is not JSON: " + err.Error()
	}
	doc := document.NewDocument(string(rec.Key))
	if err := m.MapDocument(doc, data); err != nil {
		return nil, "the index mapping refused the document: " + err.Error()
	}
	src := make([]byte, len(rec.Doc)) // records may share buffers with the batch
	copy(src, rec.Doc)
	doc.AddField(document.NewTextFieldWithIndexingOptions(SourceField, nil, src, index.StoreField))
	return doc, ""
}

// indexable decodes a document for the mapping. Numbers become float64, as
// bleve indexes them; one beyond float64's range is left out of the index
// (it is still stored, exactly, in SourceField). A document that is not an
// object is indexed as {ValueField: document}.
func indexable(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	v = floats(v)
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{ValueField: v}
	}
	return v, nil
}

func floats(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return nil // out of float64's range: bleve's mapping skips a nil
		}
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = floats(e)
		}
	case []any:
		for i, e := range x {
			x[i] = floats(e)
		}
	}
	return v
}
