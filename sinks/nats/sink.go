package nats

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kairos-es/kairos/feed"
)

// The headers every message the sink writes carries, so that a consumer of
// a bucket's stream, or a reader, can apply the feed's rules itself.
const (
	// HeaderFeed holds Options.Feed.
	HeaderFeed = "Kairos-Feed"
	// HeaderGeneration holds the generation of the copy the message was
	// written to (0 for the copy New makes before any resync).
	HeaderGeneration = "Kairos-Generation"
	// HeaderSeq holds the record's feed seq, in decimal: what the seq guard
	// compares.
	HeaderSeq = "Kairos-Seq"
	// HeaderFloor is on the pointer's message, not on records: the floor of
	// the copy the pointer names, in decimal (absent: none). The sink
	// ignores records below it; see # Guarantees in the package doc.
	HeaderFloor = "Kairos-Floor"
)

// PointerKey is the key, in the Options.Bucket bucket, whose value is the
// name of the bucket that holds the live copy.
const PointerKey = "live"

const (
	kvOperation = "KV-Operation" // JetStream KV's delete marker header
	kvDelete    = "DEL"
	suffixLen   = 8 // hex digits of a copy's random suffix
	// maxRounds bounds how often one Apply re-reads and republishes a key
	// that other writers keep changing under it.
	maxRounds = 8
	// readers bounds the concurrent reads of the keys whose conditional
	// publish lost (see resolve).
	readers = 32
)

// Sink mirrors a feed into JetStream key-value buckets. The package doc says
// what it guarantees. It is safe for concurrent use.
type Sink struct {
	nc   *nats.Conn
	own  bool
	js   jetstream.JetStream
	opts Options
	ptr  jetstream.KeyValue
	// ptrStream is ptr's stream, read directly so that the pointer's
	// headers (its floor) come with its value.
	ptrStream  jetstream.Stream
	ptrSubject string // $KV.<Bucket>.<PointerKey>
	maxDoc     int
	copyRe     *regexp.Regexp

	mu   sync.Mutex
	live *copyState // the copy the pointer named at the last Apply
}

// copyState is one bucket the sink writes to: the live copy or a resync's.
type copyState struct {
	name string
	gen  feed.Generation
	// floor is the live copy's floor, read with the pointer (a copy's
	// floor never changes once it is live); a resync's copy keeps its own
	// in the resync until Publish.
	floor  feed.Seq
	stream jetstream.Stream
	prefix string // "$KV.<name>."
	hints  *hints
}

// Connect is New over a connection it opens to url (nats://host:4222, or a
// comma-separated list of servers); Close closes it. The connection
// reconnects for ever and buffers nothing while it is down (see # Faults in
// the package doc); natsOpts come after the sink's own, so a caller can add
// credentials or TLS. An error never repeats a password of url.
func Connect(ctx context.Context, serverURL string, opts Options, natsOpts ...nats.Option) (*Sink, error) {
	if serverURL == "" {
		return nil, feed.Invalid("nats.url", "must not be empty")
	}
	ropts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	all := append([]nats.Option{
		nats.Name("kairos sink " + ropts.Bucket),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.Timeout(5 * time.Second),
	}, natsOpts...)
	nc, err := nats.Connect(serverURL, all...)
	if err != nil {
		return nil, fmt.Errorf("nats: connecting to %s: %w", redactURL(serverURL), err)
	}
	s, err := newSink(ctx, nc, true, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// redactURL is serverURL with every password replaced, for error messages.
func redactURL(serverURL string) string {
	var out []byte
	for i, part := range splitComma(serverURL) {
		if i > 0 {
			out = append(out, ',')
		}
		if u, err := url.Parse(part); err == nil {
			out = append(out, u.Redacted()...)
		} else {
			out = append(out, "(an address that does not parse)"...)
		}
	}
	return string(out)
}

func splitComma(s string) []string {
	var parts []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return parts
}

// New returns a sink over nc once the server answered with JetStream
// enabled: it creates the pointer bucket (Options.Bucket) and, when the
// pointer is absent, an empty first copy it points to. The server's max
// payload, read from nc, bounds documents (see MaxDocumentBytes). Close does
// not close nc. A connection of the caller's should be made with
// nats.ReconnectBufSize(-1), as Connect's is (see # Faults).
func New(ctx context.Context, nc *nats.Conn, opts Options) (*Sink, error) {
	if nc == nil {
		return nil, feed.Invalid("nats.conn", "must not be nil")
	}
	return newSink(ctx, nc, false, opts)
}

func newSink(ctx context.Context, nc *nats.Conn, own bool, opts Options) (*Sink, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc,
		// The sink keeps its own window per call (see apply); this bound
		// only stops concurrent calls from piling up without limit.
		jetstream.WithPublishAsyncMaxPending(4*opts.Window),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	s := &Sink{
		nc: nc, own: own, js: js, opts: opts,
		copyRe: regexp.MustCompile(`^` + opts.Bucket + `-g([0-9]{1,19})-[0-9a-f]{` + strconv.Itoa(suffixLen) + `}$`),
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return nil, fmt.Errorf("nats: the server does not answer for JetStream (is it enabled, with -js?): %w", err)
	}
	s.maxDoc = int(nc.MaxPayload()) - maxHeaderBytes(opts.Feed)
	if s.maxDoc < 16 {
		return nil, fmt.Errorf("nats: the server's max payload (%d bytes) leaves no room for a document beside the sink's headers", nc.MaxPayload())
	}
	s.ptr, err = js.KeyValue(ctx, opts.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		s.ptr, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: opts.Bucket, Description: "kairos: the name of the bucket that holds the live copy, under key " + PointerKey,
			History: 1, Replicas: opts.Replicas, Storage: s.storage(),
		})
	}
	if err != nil {
		return nil, fmt.Errorf("nats: the pointer bucket %s: %w", opts.Bucket, err)
	}
	if s.ptrStream, err = js.Stream(ctx, "KV_"+opts.Bucket); err != nil {
		return nil, fmt.Errorf("nats: the pointer bucket %s's stream: %w", opts.Bucket, err)
	}
	s.ptrSubject = "$KV." + opts.Bucket + "." + PointerKey
	if _, err := s.liveCopy(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sink) storage() jetstream.StorageType {
	if s.opts.MemoryStorage {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// MaxDocumentBytes is the largest document the sink stores: the server's max
// payload, read by New, less the most the sink's headers can take. A larger
// document is rejected.
func (s *Sink) MaxDocumentBytes() int { return s.maxDoc }

// Close closes the connection when Connect opened it.
func (s *Sink) Close() {
	if s.own {
		s.nc.Close()
	}
}

// maxHeaderBytes is the most the headers of one message take on the wire
// (nats.Msg's encoding: a status line, "Name: value\r\n" each, a blank
// line), with every number at its widest.
func maxHeaderBytes(feedName string) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for name, width := range map[string]int{
		HeaderFeed:                          len(feedName),
		HeaderGeneration:                    19,
		HeaderSeq:                           19,
		jetstream.MsgIDHeader:               msgIDLen,
		jetstream.ExpectedLastSubjSeqHeader: 20,
	} {
		n += len(name) + len(": ") + width + len("\r\n")
	}
	return n
}

// msgIDLen is the length of every message id: 19 digits of seq, '-', 32 hex
// digits of the key's hash.
const msgIDLen = 19 + 1 + 32

// msgID is the message's Nats-Msg-Id: the same for every send of the same
// record, so the server drops a retry of a publish it stored but whose ack
// was lost; the seq alone would do within one feed, the hash of feed and key
// keeps ids distinct should two feeds share a bucket.
func msgID(feedName string, key feed.Key, seq feed.Seq) string {
	h := sha256.New()
	h.Write([]byte(feedName))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return fmt.Sprintf("%019d-%s", seq, hex.EncodeToString(h.Sum(sum[:0])[:16]))
}

// liveCopy reads the pointer and returns the copy it names, with its floor,
// making the first one when there is no pointer yet.
func (s *Sink) liveCopy(ctx context.Context) (*copyState, error) {
	for attempt := 0; ; attempt++ {
		name, floor, err := s.readPointer(ctx)
		if errors.Is(err, jetstream.ErrKeyNotFound) && attempt < 3 {
			if err := s.first(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("nats: reading the pointer %s.%s: %w", s.opts.Bucket, PointerKey, err)
		}
		s.mu.Lock()
		c := s.live
		s.mu.Unlock()
		if c != nil && c.name == name {
			return c, nil
		}
		c, err = s.openCopy(ctx, name)
		if err != nil {
			return nil, err
		}
		c.floor = floor
		s.mu.Lock()
		if s.live == nil || s.live.name != name {
			s.live = c
		} else {
			c = s.live
		}
		s.mu.Unlock()
		return c, nil
	}
}

// readPointer reads the pointer's last message: the live copy's name (its
// value, as any KV client reads it) and its floor (HeaderFloor), in one
// read. It is ErrKeyNotFound when there is no pointer.
func (s *Sink) readPointer(ctx context.Context) (string, feed.Seq, error) {
	m, err := s.ptrStream.GetLastMsgForSubject(ctx, s.ptrSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", 0, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return "", 0, err
	}
	if op := m.Header.Get(kvOperation); op != "" {
		return "", 0, jetstream.ErrKeyNotFound // deleted or purged by hand
	}
	var floor feed.Seq
	if v := m.Header.Get(HeaderFloor); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return "", 0, fmt.Errorf("its %s header %q is not a seq", HeaderFloor, v)
		}
		floor = feed.Seq(n)
	}
	return string(m.Data), floor, nil
}

// first makes an empty copy of generation 0 and points to it, unless a
// rival pointed to one first, whose copy then wins and ours is removed.
func (s *Sink) first(ctx context.Context) error {
	name, err := s.createCopy(ctx, 0)
	if err != nil {
		return err
	}
	if _, err := s.ptr.Create(ctx, PointerKey, []byte(name)); err != nil {
		_ = s.js.DeleteKeyValue(ctx, name)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil
		}
		return fmt.Errorf("nats: writing the pointer %s.%s: %w", s.opts.Bucket, PointerKey, err)
	}
	return nil
}

// createCopy creates a fresh, empty bucket for generation g under a name
// no earlier copy had.
func (s *Sink) createCopy(ctx context.Context, g feed.Generation) (string, error) {
	var b [suffixLen / 2]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("%s-g%d-%s", s.opts.Bucket, g, hex.EncodeToString(b[:]))
	_, err := s.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      name,
		Description: fmt.Sprintf("kairos: a copy of feed %s, generation %d", s.opts.Feed, g),
		History:     1, Replicas: s.opts.Replicas, Storage: s.storage(),
	})
	if err != nil {
		return "", fmt.Errorf("nats: creating the bucket %s: %w", name, err)
	}
	return name, nil
}

// openCopy returns the state of the existing copy name.
func (s *Sink) openCopy(ctx context.Context, name string) (*copyState, error) {
	var g feed.Generation
	if m := s.copyRe.FindStringSubmatch(name); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		g = feed.Generation(n)
	}
	st, err := s.js.Stream(ctx, "KV_"+name)
	if err != nil {
		return nil, fmt.Errorf("nats: the bucket %s the pointer names: %w", name, err)
	}
	return &copyState{name: name, gen: g, stream: st, prefix: "$KV." + name + ".", hints: newHints(s.opts.HintKeys)}, nil
}

// Apply writes records to the live copy: see feed.Sink and the package doc.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	c, err := s.liveCopy(ctx)
	if err != nil {
		return nil, err
	}
	return s.apply(ctx, c, c.floor, records)
}

// todo is one record still to be written in an apply round, with the stream
// sequence its publish expects as the subject's last (0: none).
type todo struct {
	i        int
	expected uint64
}

type inflight struct {
	todo
	fut jetstream.PubAckFuture
}

// apply writes records to copy c, whose floor is floor. Records below the
// floor, of an older generation, are dropped unsent. Each round publishes
// every record still to be written, at most Window awaiting their acks at
// once, each conditional on the subject's last stream sequence; the
// records whose condition failed (someone wrote the key meanwhile, or the
// sink had no hint) are re-read and either dropped (the stored seq is as
// new) or published again in the next round.
func (s *Sink) apply(ctx context.Context, c *copyState, floor feed.Seq, records []feed.Record) ([]feed.Rejection, error) {
	var rejections []feed.Rejection
	round := make([]todo, 0, len(records))
	for i, r := range records {
		if r.Seq < floor {
			continue // of an older generation: a no-op, like an older seq
		}
		h, ok := c.hints.get(r.Key)
		if ok && h.seq >= r.Seq {
			continue // the copy holds this version or a newer one already
		}
		round = append(round, todo{i: i, expected: h.stream})
	}
	for n := 0; len(round) > 0; n++ {
		if n == maxRounds {
			return rejections, fmt.Errorf("nats: %d keys of the bucket %s kept changing under the sink for %d rounds; another writer?", len(round), c.name, maxRounds)
		}
		var lost []todo
		var failed error
		window := make([]inflight, 0, min(len(round), s.opts.Window))
		settle := func(p inflight) error {
			r := records[p.i]
			select {
			case ack := <-p.fut.Ok():
				c.hints.put(r.Key, hint{stream: ack.Sequence, seq: r.Seq})
			case err := <-p.fut.Err():
				switch apiCode(err) {
				case jetstream.JSErrCodeStreamWrongLastSequence:
					lost = append(lost, p.todo)
				case jetstream.JSErrCodeStreamMessageExceedsMaximum:
					rejections = append(rejections, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "the bucket " + c.name + " refuses the message as too large: " + err.Error()})
				default:
					if failed == nil {
						failed = fmt.Errorf("nats: publishing %q to the bucket %s: %w", r.Key, c.name, err)
					}
				}
			case <-ctx.Done():
				return fmt.Errorf("nats: waiting for the acks of the bucket %s: %w", c.name, context.Cause(ctx))
			}
			return nil
		}
		for _, td := range round {
			r := records[td.i]
			if len(r.Doc) > s.maxDoc {
				rejections = append(rejections, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: fmt.Sprintf("the document is %d bytes, more than the %d the server's max payload leaves beside the sink's headers", len(r.Doc), s.maxDoc)})
				continue
			}
			if len(window) == cap(window) {
				if err := settle(window[0]); err != nil {
					return nil, err
				}
				window = append(window[:0], window[1:]...)
			}
			fut, err := s.js.PublishMsgAsync(c.message(s.opts.Feed, r, td.expected))
			if errors.Is(err, nats.ErrMaxPayload) {
				rejections = append(rejections, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "the message is larger than the server's max payload"})
				continue
			}
			if err != nil {
				// The connection is down, or closed: nothing more can
				// be sent. What is in flight resolves or times out by
				// itself, and the seq guard makes its late landing
				// harmless.
				return nil, fmt.Errorf("nats: publishing to the bucket %s: %w", c.name, err)
			}
			window = append(window, inflight{todo: td, fut: fut})
		}
		for _, p := range window {
			if err := settle(p); err != nil {
				return nil, err
			}
		}
		if failed != nil {
			return nil, failed
		}
		next, err := s.resolve(ctx, c, records, lost)
		if err != nil {
			return nil, err
		}
		round = next
	}
	return rejections, nil
}

// resolve re-reads the keys whose conditional publish lost, and returns
// those still to be written, each expecting the stream sequence just read.
func (s *Sink) resolve(ctx context.Context, c *copyState, records []feed.Record, lost []todo) ([]todo, error) {
	if len(lost) == 0 {
		return nil, nil
	}
	next := make([]todo, len(lost))
	keep := make([]bool, len(lost))
	errs := make([]error, len(lost))
	sem := make(chan struct{}, readers)
	var wg sync.WaitGroup
	for j, td := range lost {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r := records[td.i]
			stored, seq, err := lastOf(ctx, c.stream, c.prefix+EncodeKey(r.Key))
			if err != nil {
				errs[j] = fmt.Errorf("nats: re-reading %q in the bucket %s: %w", r.Key, c.name, err)
				return
			}
			if seq >= r.Seq {
				c.hints.put(r.Key, hint{stream: stored, seq: seq}) // as new or newer: nothing to do
				return
			}
			next[j], keep[j] = todo{i: td.i, expected: stored}, true
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := next[:0]
	for j := range next {
		if keep[j] {
			out = append(out, next[j])
		}
	}
	return out, nil
}

// lastOf returns the stream sequence of the last message on subject (0 when
// there is none) and the feed seq its HeaderSeq holds (0 when it holds none:
// a message another writer put there).
func lastOf(ctx context.Context, st jetstream.Stream, subject string) (stream uint64, seq feed.Seq, err error) {
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	n, _ := strconv.ParseInt(m.Header.Get(HeaderSeq), 10, 64)
	return m.Sequence, feed.Seq(n), nil
}

// message is r as a message to c: the document as its data (none for a
// tombstone, which is a KV delete marker), the feed, generation and seq in
// headers, the id the server deduplicates on, and the condition that the
// subject's last message is still the one at stream sequence expected.
func (c *copyState) message(feedName string, r feed.Record, expected uint64) *nats.Msg {
	h := nats.Header{
		HeaderFeed:                          {feedName},
		HeaderGeneration:                    {strconv.FormatInt(int64(c.gen), 10)},
		HeaderSeq:                           {strconv.FormatInt(int64(r.Seq), 10)},
		jetstream.MsgIDHeader:               {msgID(feedName, r.Key, r.Seq)},
		jetstream.ExpectedLastSubjSeqHeader: {strconv.FormatUint(expected, 10)},
	}
	if r.Doc == nil {
		h[kvOperation] = []string{kvDelete}
	}
	return &nats.Msg{Subject: c.prefix + EncodeKey(r.Key), Header: h, Data: r.Doc}
}

// apiCode is the JetStream error code err carries, 0 when none.
func apiCode(err error) jetstream.ErrorCode {
	var je jetstream.JetStreamError
	if errors.As(err, &je) && je.APIError() != nil {
		return je.APIError().ErrorCode
	}
	return 0
}

// OpenResync creates a fresh bucket for generation g, after removing every
// copy of this sink's that the pointer does not name: a crashed or aborted
// resync's, or an old live copy whose removal failed after a publish.
func (s *Sink) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	if g < 1 {
		return nil, feed.Invalid("generation", "is %d; a resync is for generation 1 or later", g)
	}
	e, err := s.ptr.Get(ctx, PointerKey)
	if err != nil {
		return nil, fmt.Errorf("nats: reading the pointer %s.%s: %w", s.opts.Bucket, PointerKey, err)
	}
	live := string(e.Value())
	names := s.js.KeyValueStoreNames(ctx)
	var orphans []string
	for name := range names.Name() {
		if name != live && s.copyRe.MatchString(name) {
			orphans = append(orphans, name)
		}
	}
	if err := names.Error(); err != nil {
		return nil, fmt.Errorf("nats: listing the buckets: %w", err)
	}
	for _, name := range orphans {
		if err := s.js.DeleteKeyValue(ctx, name); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("nats: removing the bucket %s an earlier resync left: %w", name, err)
		}
	}
	name, err := s.createCopy(ctx, g)
	if err != nil {
		return nil, err
	}
	c, err := s.openCopy(ctx, name)
	if err != nil {
		_ = s.js.DeleteKeyValue(ctx, name)
		return nil, err
	}
	return &resync{s: s, c: c, ptrRev: e.Revision(), old: live}, nil
}

// resync is a copy being filled for a generation.
type resync struct {
	s      *Sink
	c      *copyState
	ptrRev uint64 // the pointer's revision when the resync opened
	old    string // the live copy then
	// floor is the copy's floor, set by the first Apply that is sent
	// records, or by SetFloor; Publish writes it on the pointer. Only this value ever
	// writes to its copy before then (see # Guarantees in the package
	// doc), so it is kept here until the publish.
	mu    sync.Mutex
	floor feed.Seq
}

func (r *resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	r.mu.Lock()
	if r.floor == 0 && len(records) > 0 {
		r.floor = records[0].Seq
		for _, rec := range records[1:] {
			r.floor = min(r.floor, rec.Seq)
		}
	}
	floor := r.floor
	r.mu.Unlock()
	return r.s.apply(ctx, r.c, floor, records)
}

// SetFloor gives a copy that was sent no record its floor, which Publish
// then writes on the pointer; see feed.FloorSetter. It sends nothing to the
// server.
func (r *resync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.mu.Lock()
	r.floor = floor
	r.mu.Unlock()
	return nil
}

// Publish points the pointer at this copy, with the copy's floor in the
// same message, on the condition that it has not moved since OpenResync (a
// rival that published meanwhile wins), then removes the copy it replaced.
func (r *resync) Publish(ctx context.Context) error {
	if _, err := r.c.stream.Info(ctx); err != nil {
		return fmt.Errorf("nats: the resync's bucket %s (another worker's resync may have removed it): %w", r.c.name, err)
	}
	r.mu.Lock()
	live := *r.c
	live.floor = r.floor
	r.mu.Unlock()
	// What the KV's Update sends, with the floor as a header: KV clients
	// read the value alone, the sinks read both.
	m := &nats.Msg{Subject: r.s.ptrSubject, Data: []byte(live.name), Header: nats.Header{}}
	if live.floor > 0 {
		m.Header.Set(HeaderFloor, strconv.FormatInt(int64(live.floor), 10))
	}
	if _, err := r.s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(r.ptrRev)); err != nil {
		return fmt.Errorf("nats: pointing %s.%s at %s: %w", r.s.opts.Bucket, PointerKey, r.c.name, err)
	}
	r.s.mu.Lock()
	r.s.live = &live
	r.s.mu.Unlock()
	// Readers that read the pointer before the update and the old copy
	// after this find it gone, and read the pointer again (see Reader).
	if err := r.s.js.DeleteKeyValue(ctx, r.old); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		// Published all the same; the next OpenResync removes it.
		return nil
	}
	return nil
}

// Abort removes this copy's bucket, and nothing else.
func (r *resync) Abort(ctx context.Context) error {
	if err := r.s.js.DeleteKeyValue(ctx, r.c.name); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("nats: removing the resync's bucket %s: %w", r.c.name, err)
	}
	return nil
}

// hint is what a copy remembers of a key from its own writes: the stream
// sequence of the key's last message and the feed seq it holds.
type hint struct {
	stream uint64
	seq    feed.Seq
}

// hints is a bounded map of keys' hints. A hint is only ever a guess: the
// server checks each conditional publish against the subject's real last
// sequence. It can only be behind the truth, never ahead (every write to a
// key raises its feed seq), so a record at or below a hint's seq is
// already superseded and need not be sent.
type hints struct {
	mu  sync.Mutex
	max int
	m   map[feed.Key]hint
}

func newHints(max int) *hints { return &hints{max: max, m: map[feed.Key]hint{}} }

func (h *hints) get(k feed.Key) (hint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.m[k]
	return v, ok
}

func (h *hints) put(k feed.Key, v hint) {
	if h.max == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.m[k]; ok && old.seq > v.seq {
		return
	}
	if _, ok := h.m[k]; !ok && len(h.m) >= h.max {
		// Forget an eighth, whichever the map yields first: a forgotten
		// key costs one failed publish and a read on its next write.
		drop := max(1, h.max/8)
		for k := range h.m {
			delete(h.m, k)
			if drop--; drop == 0 {
				break
			}
		}
	}
	h.m[k] = v
}
