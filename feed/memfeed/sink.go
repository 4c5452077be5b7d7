package memfeed

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"github.com/kairos-es/kairos/feed"
)

// SinkOptions configure a Sink. The zero value accepts every record.
type SinkOptions struct {
	// Reject, when set, is asked about every record; a non-empty answer refuses
	// the record with that reason (it is then parked by the worker).
	Reject func(r feed.Record) string
}

// Sink is an in-memory feed.Sink: the reference every real sink is compared
// with. It keeps feed.Sink's seq guard: it remembers the seq of each key
// it has seen, deletions included, and ignores a record older than that, so even
// a stale call from a worker that lost its lease cannot bring back an older
// version. Resyncs fill a fresh map that Publish swaps in at once, with the
// copy's floor (feed.Sink's doc), so a stale call of the generation before
// cannot bring back a key the copy lacks; its targets are feed.FloorSetters,
// so a copy that was sent no record has one too.
type Sink struct {
	opts SinkOptions

	mu         sync.Mutex
	live       map[feed.Key]entry
	floor      feed.Seq // the live copy's; 0 before the first resync
	generation feed.Generation
}

type entry struct {
	seq feed.Seq
	doc json.RawMessage // nil: deleted
}

// NewSink returns an empty sink.
func NewSink(opts SinkOptions) *Sink {
	return &Sink{opts: opts, live: make(map[feed.Key]entry)}
}

// Apply applies records to the published copy; see feed.Sink.
func (s *Sink) Apply(_ context.Context, records []feed.Record) ([]feed.Rejection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apply(s.live, s.floor, records), nil
}

// apply applies records to m, ignoring those below floor.
func (s *Sink) apply(m map[feed.Key]entry, floor feed.Seq, records []feed.Record) []feed.Rejection {
	var rejected []feed.Rejection
	for _, r := range records {
		if s.opts.Reject != nil {
			if reason := s.opts.Reject(r); reason != "" {
				rejected = append(rejected, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: reason})
				continue
			}
		}
		if r.Seq < floor {
			continue // of a generation before the copy's
		}
		if old, ok := m[r.Key]; ok && old.seq > r.Seq {
			continue // a newer version is already here
		}
		m[r.Key] = entry{seq: r.Seq, doc: clone(r.Doc)}
	}
	return rejected
}

// OpenResync opens a fresh, empty copy for generation; see feed.Sink.
func (s *Sink) OpenResync(_ context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", generation)
	}
	return &resync{s: s, generation: generation, m: make(map[feed.Key]entry)}, nil
}

// Documents returns the published copy's live documents.
func (s *Sink) Documents() map[feed.Key]json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[feed.Key]json.RawMessage, len(s.live))
	for k, e := range s.live {
		if e.doc != nil {
			out[k] = clone(e.doc)
		}
	}
	return out
}

// Generation returns the generation of the last published resync; 0 before the
// first.
func (s *Sink) Generation() feed.Generation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.generation
}

var errTargetClosed = errors.New("memfeed: the resync target was already published or aborted")

type resync struct {
	s          *Sink
	generation feed.Generation
	mu         sync.Mutex
	m          map[feed.Key]entry // nil once published or aborted
	floor      feed.Seq           // set by the first non-empty Apply, or SetFloor
}

func (r *resync) Apply(_ context.Context, records []feed.Record) ([]feed.Rejection, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return nil, errTargetClosed
	}
	if r.floor == 0 && len(records) > 0 {
		r.floor = records[0].Seq
		for _, rec := range records {
			r.floor = min(r.floor, rec.Seq)
		}
	}
	return r.s.apply(r.m, r.floor, records), nil
}

// SetFloor gives a copy that was sent no record its floor; see
// feed.FloorSetter.
func (r *resync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return errTargetClosed
	}
	r.floor = floor
	return nil
}

func (r *resync) Publish(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return errTargetClosed
	}
	r.s.mu.Lock()
	r.s.live, r.s.floor, r.s.generation = r.m, r.floor, r.generation
	r.s.mu.Unlock()
	r.m = nil
	return nil
}

func (r *resync) Abort(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m = nil
	return nil
}
