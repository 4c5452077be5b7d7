package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kairos-es/kairos/feed"
)

// Reader reads what a sink serves: it follows the pointer to the live copy,
// so applications never name a generation's bucket. A publish may switch
// the pointer and remove the old copy between a Reader's read of the
// pointer and its read of the copy; the Reader then reads the pointer again
// and the new copy, so every answer comes from one copy, old or new, never
// from a removed one nor from a mix. It is safe for concurrent use.
type Reader struct {
	js     jetstream.JetStream
	bucket string

	mu      sync.Mutex
	ptr     jetstream.KeyValue
	streams map[string]jetstream.Stream // the copies' streams, by bucket
}

// Entry is one key's document as the live copy holds it.
type Entry struct {
	Key feed.Key
	Doc json.RawMessage
	// Seq is the feed seq of the document (HeaderSeq).
	Seq feed.Seq
}

// readAttempts bounds how often a read follows a pointer that moved under
// it before it gives up: each move is a whole resync, so even two in a row
// within one read are rare.
const readAttempts = 5

// NewReader returns a reader of the sink named bucket (Options.Bucket) over
// nc, once the pointer bucket exists. It does not close nc.
func NewReader(ctx context.Context, nc *nats.Conn, bucket string) (*Reader, error) {
	if nc == nil {
		return nil, feed.Invalid("nats.conn", "must not be nil")
	}
	if _, err := (Options{Bucket: bucket}).resolve(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	ptr, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("nats: the pointer bucket %s: %w", bucket, err)
	}
	return &Reader{js: js, bucket: bucket, ptr: ptr, streams: map[string]jetstream.Stream{}}, nil
}

// Bucket returns the name of the bucket that holds the live copy now.
func (r *Reader) Bucket(ctx context.Context) (string, error) {
	e, err := r.ptr.Get(ctx, PointerKey)
	if err != nil {
		return "", fmt.Errorf("nats: reading the pointer %s.%s: %w", r.bucket, PointerKey, err)
	}
	return string(e.Value()), nil
}

func (r *Reader) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	r.mu.Lock()
	st := r.streams[name]
	r.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := r.js.Stream(ctx, "KV_"+name)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	clear(r.streams) // only the live copy's is worth keeping
	r.streams[name] = st
	r.mu.Unlock()
	return st, nil
}

// follow runs read on the copy the pointer names; when read fails, or finds
// nothing, and the pointer has moved meanwhile, it runs it again on the new
// copy, since the failure may be the old copy's removal.
func (r *Reader) follow(ctx context.Context, read func(name string, st jetstream.Stream) (found bool, err error)) (bool, error) {
	name, err := r.Bucket(ctx)
	if err != nil {
		return false, err
	}
	for attempt := 1; ; attempt++ {
		st, err := r.stream(ctx, name)
		var found bool
		if err == nil {
			found, err = read(name, st)
			if err == nil && found {
				return true, nil
			}
		}
		now, perr := r.Bucket(ctx)
		if perr != nil {
			return false, perr
		}
		if now == name || attempt == readAttempts {
			return found, err
		}
		name = now
	}
}

// Get returns key's document and seq from the live copy; ok is false when
// the copy does not hold the key (never written, or deleted).
func (r *Reader) Get(ctx context.Context, key feed.Key) (e Entry, ok bool, err error) {
	ok, err = r.follow(ctx, func(name string, st jetstream.Stream) (bool, error) {
		m, err := st.GetLastMsgForSubject(ctx, "$KV."+name+"."+EncodeKey(key))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if m.Header.Get(kvOperation) != "" {
			return false, nil // a delete marker, or a purge
		}
		seq, _ := strconv.ParseInt(m.Header.Get(HeaderSeq), 10, 64)
		e = Entry{Key: key, Doc: m.Data, Seq: feed.Seq(seq)}
		return true, nil
	})
	if err != nil {
		return Entry{}, false, fmt.Errorf("nats: reading %q: %w", key, err)
	}
	return e, ok, nil
}

// Documents returns every live document of the live copy, by key. It reads
// one copy whole: a publish racing it makes it start over on the new copy.
// It holds the whole copy in memory; Scan does not.
func (r *Reader) Documents(ctx context.Context) (map[feed.Key]json.RawMessage, error) {
	var out map[feed.Key]json.RawMessage
	err := r.scan(ctx, func() { out = map[feed.Key]json.RawMessage{} }, func(e Entry) error {
		out[e.Key] = e.Doc
		return nil
	})
	return out, err
}

// Keys returns the keys of the live copy's documents, in no set order.
func (r *Reader) Keys(ctx context.Context) ([]feed.Key, error) {
	var out []feed.Key
	err := r.scan(ctx, func() { out = out[:0] }, func(e Entry) error {
		out = append(out, e.Key)
		return nil
	})
	return out, err
}

// Scan calls fn with each live document of the live copy, in the order of
// their last writes. When a publish removes the copy under it, Scan calls
// restart and starts over on the new copy, so what fn saw after the last
// restart is one copy whole. An error from fn ends the scan with it.
func (r *Reader) Scan(ctx context.Context, restart func(), fn func(Entry) error) error {
	return r.scan(ctx, restart, fn)
}

// errMoved says a scan's copy vanished under it.
var errMoved = errors.New("the copy was removed during the read")

func (r *Reader) scan(ctx context.Context, restart func(), fn func(Entry) error) error {
	var fnErr error
	_, err := r.follow(ctx, func(name string, st jetstream.Stream) (bool, error) {
		restart()
		err := scanCopy(ctx, r.js, name, st, func(e Entry) error {
			if err := fn(e); err != nil {
				fnErr = err
				return err
			}
			return nil
		})
		if err != nil && fnErr == nil {
			return false, err
		}
		return true, err
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil {
		return fmt.Errorf("nats: reading the live copy of %s: %w", r.bucket, err)
	}
	return nil
}

// scanCopy reads the last message of every subject of one copy through an
// ephemeral consumer, removed afterwards, and calls fn with each document.
func scanCopy(ctx context.Context, js jetstream.JetStream, name string, st jetstream.Stream, fn func(Entry) error) error {
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     "$KV." + name + ".>",
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		HeadersOnly:       false,
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name) // else it lapses after InactiveThreshold
	}()
	pending := cons.CachedInfo().NumPending
	prefix := len("$KV." + name + ".")
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, 512)), jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			pending = md.NumPending
			h := m.Headers()
			if h.Get(kvOperation) != "" {
				continue
			}
			key, err := DecodeKey(m.Subject()[prefix:])
			if err != nil {
				continue // a key the sink did not write
			}
			seq, _ := strconv.ParseInt(h.Get(HeaderSeq), 10, 64)
			if err := fn(Entry{Key: key, Doc: m.Data(), Seq: feed.Seq(seq)}); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if got == 0 {
			// Nothing came in the wait: the copy may be gone (a publish
			// removed it, and its consumer with it).
			if _, err := st.Info(ctx); err != nil {
				if errors.Is(err, jetstream.ErrStreamNotFound) {
					return errMoved
				}
				return err
			}
			if _, err := cons.Info(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}
