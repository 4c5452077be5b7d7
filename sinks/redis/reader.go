package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
)

// Reader reads the live copy of a sink's documents, following the pointer
// so that an application never needs to know generations or namespaces.
// It is safe for concurrent use, and cheap: keep one per prefix.
//
// # Readers racing a publish
//
// A read is one round trip: the document keys of the namespace the Reader
// last saw live, then, in the same pipeline, the pointer. When the pointer
// still names that namespace, the read is answered; when it moved (a
// publish), the Reader reads again from the new namespace, so it never
// answers from a copy it knows is retired, nor mixes two copies in one
// MGet. On one server the commands of a pipeline run in order on one
// connection, so an answered read saw the copy while it was live: a key
// reads as the old copy's version or the new one's, and a key the live copy
// holds never reads as missing because the collector was removing the old
// copy. In a cluster the pipeline's commands go to their nodes in parallel,
// so a read that overlaps a publish may still answer from the old copy, or
// miss a key the collector just removed from it; the next read follows the
// pointer.
type Reader struct {
	client goredis.UniversalClient
	l      layout
	hash   bool
	live   atomic.Pointer[string]
}

// NewReader returns a Reader of the copy a sink with the same Prefix and
// Encoding serves; opts' other fields are not used.
func NewReader(client goredis.UniversalClient, opts Options) (*Reader, error) {
	if client == nil {
		return nil, feed.Invalid("redis.client", "must not be nil")
	}
	o, err := Options{Prefix: opts.Prefix, Encoding: opts.Encoding}.resolve()
	if err != nil {
		return nil, err
	}
	return &Reader{client: client, l: layout{o.Prefix}, hash: o.Encoding == EncodingHash}, nil
}

// Get returns key's document in the live copy, and false when the copy
// does not hold it.
func (r *Reader) Get(ctx context.Context, key feed.Key) (json.RawMessage, bool, error) {
	docs, err := r.MGet(ctx, key)
	if err != nil {
		return nil, false, err
	}
	return docs[0], docs[0] != nil, nil
}

// MGet returns the documents of keys in the live copy, in their order, nil
// where the copy holds none, all read from one copy.
func (r *Reader) MGet(ctx context.Context, keys ...feed.Key) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(keys))
	ns := ""
	if p := r.live.Load(); p != nil {
		ns = *p
	}
	for range maxFollows + 1 {
		if ns == "" {
			live, err := r.client.HGet(ctx, r.l.meta(), fieldLive).Result()
			switch {
			case errors.Is(err, goredis.Nil):
				return out, nil // no sink ever wrote under this prefix
			case err != nil:
				return nil, classify("reading the live copy's pointer", err)
			}
			ns = live
		}
		pipe := r.client.Pipeline()
		strs := make([]*goredis.StringCmd, len(keys))
		hashes := make([]*goredis.MapStringStringCmd, len(keys))
		for i, k := range keys {
			if r.hash {
				hashes[i] = pipe.HGetAll(ctx, r.l.docKey(ns, k))
			} else {
				strs[i] = pipe.Get(ctx, r.l.docKey(ns, k))
			}
		}
		check := pipe.HGet(ctx, r.l.meta(), fieldLive)
		_, _ = pipe.Exec(ctx)
		live, err := check.Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, classify("reading the live copy's pointer", err)
		}
		if live != ns {
			ns = live
			if ns == "" {
				return out, nil
			}
			continue
		}
		for i := range keys {
			var err error
			if r.hash {
				var m map[string]string
				if m, err = hashes[i].Result(); err == nil && len(m) > 0 {
					out[i] = objectOf(m)
				}
			} else {
				var b []byte
				if b, err = strs[i].Bytes(); err == nil {
					out[i] = b
				} else if errors.Is(err, goredis.Nil) {
					err = nil
				}
			}
			if err != nil {
				return nil, classify(fmt.Sprintf("reading %q", keys[i]), err)
			}
		}
		r.live.Store(&ns)
		return out, nil
	}
	return nil, &sinkError{op: "reading", kind: ErrServer, err: fmt.Errorf("the live copy's pointer moved %d times during one read", maxFollows+1)}
}

// objectOf rebuilds a document from its hash: each field's value is its
// member's JSON text. Members come in name order.
func objectOf(m map[string]string) json.RawMessage {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(k)
		b.Write(name)
		b.WriteByte(':')
		b.WriteString(m[k])
	}
	b.WriteByte('}')
	return json.RawMessage(b.String())
}
