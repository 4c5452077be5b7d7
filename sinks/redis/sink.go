package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
)

const (
	// maxGroupRecords and maxGroupBytes bound one script call, so that no
	// call holds the server (which runs a script to its end before anything
	// else) for long; a batch of more is several calls in the same
	// pipeline. A record larger than maxGroupBytes is a call alone.
	maxGroupRecords = 512
	maxGroupBytes   = 4 << 20
	// maxFollows bounds how often one Apply follows a pointer that moved
	// under it before it gives up with an error.
	maxFollows = 3
)

// Sink mirrors a feed into Redis keys under one prefix. The package doc
// says what it guarantees. It is safe for concurrent use.
type Sink struct {
	client  goredis.UniversalClient
	own     bool // Open made client, and Close closes it
	cluster *goredis.ClusterClient
	opts    Options
	l       layout
	// live caches the live namespace and its floor. Every Apply checks it
	// in the same round trip (see write) and follows the pointer when it
	// moved.
	live atomic.Pointer[copyRef]
	// The script's fixed arguments.
	ttl, tombTTL, want string

	sweepMu   sync.Mutex
	kick      chan struct{}
	stop      context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// copyRef names a namespace and its floor: the lowest seq the copy keeps
// (0: none), records below which are of an older generation (doc.go, # The
// floor). A namespace's floor never changes once it is live, so the pair,
// read together, can be cached for as long as the namespace is live.
type copyRef struct {
	ns    string
	floor feed.Seq
}

// New returns a sink over client (a *goredis.Client, a failover client, or
// a *goredis.ClusterClient) once the server answered PING and the meta hash
// names a live copy, which New creates, empty, on a target that has none.
// The client must have ContextTimeoutEnabled set, so that the worker's
// deadline bounds each call; a Ring is refused, since no pointer key can be
// switched atomically across its shards. New refuses a server whose
// maxmemory-policy may evict any key (allkeys-*), which could evict the
// pointer and the seqs the guard keeps; a server that hides its CONFIG is
// taken as it is. Close does not close client.
func New(ctx context.Context, client goredis.UniversalClient, opts Options) (*Sink, error) {
	if client == nil {
		return nil, feed.Invalid("redis.client", "must not be nil")
	}
	return newSink(ctx, client, false, opts)
}

// Open is New over a client it makes from a redis:// or rediss:// URL
// (redis://user:password@host:6379/0), named opts.ClientName, with
// ContextTimeoutEnabled and no retries of its own (the worker retries);
// Close closes it. A URL that cannot be parsed is
// refused naming redis.url, its password never repeated. A cluster is
// reached through New with a *goredis.ClusterClient.
func Open(ctx context.Context, rawURL string, opts Options) (*Sink, error) {
	if rawURL == "" {
		return nil, feed.Invalid("redis.url", "must not be empty")
	}
	ro, err := goredis.ParseURL(rawURL)
	if err != nil {
		return nil, feed.Invalid("redis.url", "cannot be parsed: %s", redact(err.Error(), rawURL))
	}
	resolved, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	ro.ClientName = resolved.ClientName
	ro.ContextTimeoutEnabled = true
	// The worker retries a failed call itself, with backoff, and reports
	// it; a client retrying underneath would hide a lost connection.
	ro.MaxRetries = -1
	client := goredis.NewClient(ro)
	s, err := newSink(ctx, client, true, opts)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// redact takes a URL's password out of a message about it.
func redact(msg, rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "***")
		}
	}
	if at := strings.LastIndex(rawURL, "@"); at > 0 {
		// What url.Parse could not read: everything between the scheme's
		// "//" and the "@" may be a secret.
		if start := strings.Index(rawURL, "//"); start >= 0 && start+2 < at {
			msg = strings.ReplaceAll(msg, rawURL[start+2:at], "***")
		}
	}
	return msg
}

func newSink(ctx context.Context, client goredis.UniversalClient, own bool, opts Options) (*Sink, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	s := &Sink{client: client, own: own, opts: opts, l: layout{opts.Prefix}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	switch c := client.(type) {
	case *goredis.Ring:
		return nil, feed.Invalid("redis.client", "is a Ring, whose shards cannot switch one pointer atomically; use a Client or a ClusterClient")
	case *goredis.Client:
		if !c.Options().ContextTimeoutEnabled {
			return nil, feed.Invalid("redis.client", "does not have ContextTimeoutEnabled set, so the worker's deadline would not bound a call")
		}
	case *goredis.ClusterClient:
		if !c.Options().ContextTimeoutEnabled {
			return nil, feed.Invalid("redis.client", "does not have ContextTimeoutEnabled set, so the worker's deadline would not bound a call")
		}
		s.cluster = c
	}
	s.ttl = strconv.FormatInt(opts.TTL.Milliseconds(), 10)
	s.tombTTL = strconv.FormatInt(opts.TombstoneTTL.Milliseconds(), 10)
	s.want = "string"
	if opts.Encoding == EncodingHash {
		s.want = "hash"
	}
	if err := client.Ping(ctx).Err(); err != nil {
		return nil, classify("the server does not answer PING", err)
	}
	if policy, err := client.ConfigGet(ctx, "maxmemory-policy").Result(); err == nil && strings.HasPrefix(policy["maxmemory-policy"], "allkeys-") {
		return nil, fmt.Errorf("redis: the server's maxmemory-policy is %s, which may evict the sink's pointer and the seqs its guard keeps; use noeviction or a volatile-* policy", policy["maxmemory-policy"])
	}
	got, err := initScript.Run(ctx, client, []string{s.l.meta()}).Slice()
	if err != nil {
		return nil, classify("reading the live copy's pointer", err)
	}
	live, err := liveRef(got)
	if err != nil {
		return nil, &sinkError{op: "reading the live copy's pointer", kind: ErrServer, err: err}
	}
	s.live.Store(&live)
	sweepCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.sweeper(sweepCtx)
	s.kickSweep() // what a crashed process left
	return s, nil
}

// Prefix is the prefix the sink's keys live under.
func (s *Sink) Prefix() string { return s.opts.Prefix }

// Close stops the background collector, waiting for its step in flight,
// and closes the client when Open made it. Safe to call more than once.
func (s *Sink) Close() {
	s.closeOnce.Do(func() {
		s.stop()
		<-s.done
		if s.own {
			s.client.Close()
		}
	})
}

// Apply writes records to the live copy. See feed.Sink and doc.go.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if len(records) == 0 {
		return nil, nil
	}
	for range maxFollows {
		c := *s.live.Load()
		rej, still, got, err := s.write(ctx, c, records, false)
		if err != nil {
			return nil, err
		}
		if still {
			return rej, nil
		}
		// The pointer moved (a publish by another process): the writes
		// may have landed in a retired copy, which nobody reads again.
		// Take them out, and write to the live one, under its floor.
		s.unlink(ctx, c.ns, records)
		if got.ns == "" {
			return nil, &sinkError{op: "applying a batch", kind: ErrNoPointer, err: errors.New("the meta hash " + s.l.meta() + " names no live copy")}
		}
		s.live.Store(&got)
	}
	return nil, &sinkError{op: "applying a batch", kind: ErrServer, err: fmt.Errorf("the live copy's pointer moved %d times during one call", maxFollows)}
}

// group is one script call: records of one namespace (and one slot, in a
// cluster).
type group struct {
	keys []string
	args []any
	idx  []int // the records' indexes in the batch
	size int
}

// write applies records to namespace c.ns in one pipeline: a script call
// per group, then a read of the meta hash that says whether c.ns was still
// the live copy (still) or, for a resync (resync true), still filling or
// live, after the writes. got is the live namespace that read found, with
// its floor (ns "" for none). Records below c.floor are not sent: they are
// of an older generation than the copy's (doc.go, # The floor). A group the
// server had no script for is sent again as EVAL.
func (s *Sink) write(ctx context.Context, c copyRef, records []feed.Record, resync bool) (rej []feed.Rejection, still bool, got copyRef, err error) {
	ns := c.ns
	groups, rej := s.groups(c, records)
	for attempt := 0; ; attempt++ {
		pipe := s.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(groups))
		for i, g := range groups {
			if attempt == 0 {
				cmds[i] = applyScript.EvalSha(ctx, pipe, g.keys, g.args...)
			} else {
				cmds[i] = applyScript.Eval(ctx, pipe, g.keys, g.args...)
			}
		}
		check := pipe.HMGet(ctx, s.l.meta(), fieldLive, fieldFloor, fieldFilling+ns)
		_, _ = pipe.Exec(ctx) // each command's error is read below
		var redo []group
		for i, c := range cmds {
			if err := c.Err(); err != nil {
				if attempt == 0 && isNoScript(err) {
					redo = append(redo, groups[i])
					continue
				}
				return nil, false, copyRef{}, classify("applying a batch", err)
			}
			codes, err := c.Slice()
			if err != nil || len(codes) != len(groups[i].idx) {
				return nil, false, copyRef{}, &sinkError{op: "applying a batch", kind: ErrServer, err: fmt.Errorf("the script answered %d codes for %d records (%v)", len(codes), len(groups[i].idx), err)}
			}
			for j, code := range codes {
				if what, ok := code.(string); ok {
					r := records[groups[i].idx[j]]
					rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: wrongType(s.l.docKey(ns, r.Key), what)})
				}
			}
		}
		vals, err := check.Result()
		if err != nil {
			return nil, false, copyRef{}, classify("reading the live copy's pointer", err)
		}
		if len(vals) != 3 {
			return nil, false, copyRef{}, &sinkError{op: "reading the live copy's pointer", kind: ErrServer, err: fmt.Errorf("the server answered %d values for 3 fields of the meta hash", len(vals))}
		}
		live, err := liveRef(vals[:2])
		if err != nil {
			return nil, false, copyRef{}, &sinkError{op: "reading the live copy's pointer", kind: ErrServer, err: err}
		}
		filling := vals[2] != nil
		if len(redo) > 0 {
			groups = redo
			continue
		}
		return rej, live.ns == ns || resync && filling, live, nil
	}
}

// wrongType is the reason for a key the application wrote itself.
func wrongType(docKey, what string) string {
	which, typ, _ := strings.Cut(what, ":")
	key := docKey
	if which == "seq" {
		key = seqKeyOf(docKey)
	}
	return fmt.Sprintf("WRONGTYPE: the key %q holds a %s the sink did not write; the sink leaves it alone (remove it, or give the sink another prefix)", key, typ)
}

// liveRef reads the live and floor fields of the meta hash, as HMGET or
// initScript answer them (nil or false for a field that is absent).
func liveRef(vals []any) (copyRef, error) {
	var c copyRef
	if len(vals) != 2 {
		return copyRef{}, fmt.Errorf("the server answered %d values for the meta hash's %s and %s fields", len(vals), fieldLive, fieldFloor)
	}
	c.ns, _ = vals[0].(string)
	if f, ok := vals[1].(string); ok {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 {
			return copyRef{}, fmt.Errorf("the meta hash's %s field %q is not a seq", fieldFloor, f)
		}
		c.floor = feed.Seq(n)
	}
	return c, nil
}

// groups turns the records of c's generation (those at or above its floor)
// into script calls for namespace c.ns, rejecting those too large or, for
// the hash encoding, not a non-empty object.
func (s *Sink) groups(c copyRef, records []feed.Record) ([]group, []feed.Rejection) {
	var rej []feed.Rejection
	var groups []group
	open := map[uint16]int{} // slot → index of its group still filling, in a cluster
	for i, r := range records {
		if r.Seq < c.floor {
			continue // of an older generation: a no-op, like an older seq
		}
		var payload []any
		n := -1
		size := len(r.Key)*2 + 64
		if !r.Deleted() {
			if len(r.Doc) > s.opts.MaxDocumentBytes {
				rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: fmt.Sprintf("the document is %d bytes, more than redis.max_document_bytes (%d)", len(r.Doc), s.opts.MaxDocumentBytes)})
				continue
			}
			if s.opts.Encoding == EncodingHash {
				fields, reason := hashFields(r.Doc)
				if reason != "" {
					rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: reason})
					continue
				}
				payload, n = fields, len(fields)/2
			} else {
				payload, n = []any{[]byte(r.Doc)}, 0
			}
			size += len(r.Doc)
		}
		var slot uint16
		if s.cluster != nil {
			slot = slotOf(r.Key)
		}
		gi, ok := open[slot]
		if !ok || len(groups[gi].idx) >= maxGroupRecords || groups[gi].size+size > maxGroupBytes && len(groups[gi].idx) > 0 {
			groups = append(groups, group{args: []any{s.ttl, s.tombTTL, s.want}})
			gi = len(groups) - 1
			open[slot] = gi
		}
		g := &groups[gi]
		dk := s.l.docKey(c.ns, r.Key)
		g.keys = append(g.keys, dk, seqKeyOf(dk))
		g.args = append(g.args, strconv.FormatInt(int64(r.Seq), 10), n)
		g.args = append(g.args, payload...)
		g.idx = append(g.idx, i)
		g.size += size
	}
	return groups, rej
}

// hashFields splits a document into a hash's field/value pairs: each
// top-level member's name, decoded, and its value's JSON text. A repeated
// name keeps its last value, as the feed's jsonb does.
func hashFields(doc json.RawMessage) ([]any, string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil || m == nil {
		return nil, "the hash encoding stores JSON objects only, and this document is not one"
	}
	if len(m) == 0 {
		return nil, "the hash encoding cannot store an empty object: Redis keeps no empty hash"
	}
	out := make([]any, 0, 2*len(m))
	for k, v := range m {
		out = append(out, k, []byte(v))
	}
	return out, ""
}

// unlink removes what a batch may have written to namespace ns, which is
// no longer live nor filling (a namespace never becomes either again).
// Best effort: what it leaves, the collector takes.
func (s *Sink) unlink(ctx context.Context, ns string, records []feed.Record) {
	pipe := s.client.Pipeline()
	for _, r := range records {
		dk := s.l.docKey(ns, r.Key)
		pipe.Unlink(ctx, dk)
		pipe.Unlink(ctx, seqKeyOf(dk))
	}
	_, _ = pipe.Exec(ctx)
}

// OpenResync opens a fresh namespace of generation for a resync. See
// feed.Sink and doc.go, # Resync.
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", generation)
	}
	ns, err := openScript.Run(ctx, s.client, []string{s.l.meta()}, strconv.FormatInt(int64(generation), 10)).Text()
	if err != nil {
		return nil, classify("opening a resync", err)
	}
	s.kickSweep() // the namespaces this retired
	return &Resync{s: s, ns: ns}, nil
}

// Resync is a resync's namespace being filled; see feed.ResyncTarget.
type Resync struct {
	s  *Sink
	ns string
	// floor is the namespace's floor, set by the first Apply that is sent
	// records, or by SetFloor, and fixed from then on; Publish writes it beside the
	// pointer. Only this value ever writes to its namespace before the
	// publish (doc.go, # The floor), so it is kept here until then.
	mu    sync.Mutex
	floor feed.Seq
}

// Namespace is the namespace the resync fills: its keys are
// <prefix><namespace>:{<escaped key>}.
func (r *Resync) Namespace() string { return r.ns }

// Apply writes records to the resync's namespace only. A namespace retired
// under it (a rival's OpenResync, an Abort) is ErrSuperseded, what it wrote
// there taken out again.
func (r *Resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if len(records) == 0 {
		return nil, nil
	}
	r.mu.Lock()
	if r.floor == 0 {
		r.floor = records[0].Seq
		for _, rec := range records[1:] {
			r.floor = min(r.floor, rec.Seq)
		}
	}
	c := copyRef{ns: r.ns, floor: r.floor}
	r.mu.Unlock()
	rej, still, _, err := r.s.write(ctx, c, records, true)
	if err != nil {
		return nil, err
	}
	if !still {
		r.s.unlink(ctx, r.ns, records)
		return nil, &sinkError{op: "applying a resync batch", kind: ErrSuperseded, err: errors.New("namespace " + r.ns + " is retired")}
	}
	return rej, nil
}

// SetFloor gives a namespace that was sent no record its floor, which
// Publish then writes beside the pointer; see feed.FloorSetter. It sends
// nothing to the server.
func (r *Resync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.mu.Lock()
	r.floor = floor
	r.mu.Unlock()
	return nil
}

// Publish switches the pointer to the resync's namespace in one script,
// so readers go from the old copy to the new one at once; the old copy is
// then removed in the background. A retired namespace is ErrSuperseded.
func (r *Resync) Publish(ctx context.Context) error {
	r.mu.Lock()
	c := copyRef{ns: r.ns, floor: r.floor}
	r.mu.Unlock()
	if _, err := publishScript.Run(ctx, r.s.client, []string{r.s.l.meta()}, c.ns, strconv.FormatInt(int64(c.floor), 10)).Text(); err != nil {
		if errors.Is(err, goredis.Nil) {
			return &sinkError{op: "publishing a resync", kind: ErrSuperseded, err: errors.New("namespace " + r.ns + " is retired")}
		}
		return classify("publishing a resync", err)
	}
	r.s.live.Store(&c)
	r.s.kickSweep()
	return nil
}

// Abort retires the resync's namespace, which the collector then removes;
// nothing else is touched.
func (r *Resync) Abort(ctx context.Context) error {
	if err := r.s.client.HDel(ctx, r.s.l.meta(), fieldFilling+r.ns).Err(); err != nil {
		return classify("aborting a resync", err)
	}
	r.s.kickSweep()
	return nil
}
