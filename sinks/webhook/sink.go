package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
)

// Delivery types, the "type" of every body.
const (
	TypeApply         = "apply"
	TypeResyncBegin   = "resync.begin"
	TypeResyncApply   = "resync.apply"
	TypeResyncPublish = "resync.publish"
	TypeResyncAbort   = "resync.abort"
)

// ErrUnavailable: the receiver did not take a delivery, for a reason of its
// own or of the network (see "Answers" in the package doc). The worker
// retries the batch later.
var ErrUnavailable = errors.New("webhook: receiver unavailable")

// DeliveryError is a delivery that failed as a whole. It matches
// ErrUnavailable. Its text holds no secret of the URL.
type DeliveryError struct {
	Type string // the delivery's type, or "connection check" for New's
	ID   string // its webhook-id
	URL  string // redacted
	// Status is the receiver's answer, 0 when it gave none (network, timeout).
	Status int
	// RetryAfter is what the receiver's Retry-After asked for (429, 503), 0
	// when it did not say: the earliest the worker should send again.
	RetryAfter time.Duration
	// Excerpt is the start of the answer's body, cleaned and redacted.
	Excerpt string
	Err     error
}

// RetryDelay is RetryAfter, for feed.RetryDelayer: the sync driver waits at
// least that long before it sends again.
func (e *DeliveryError) RetryDelay() time.Duration { return e.RetryAfter }

func (e *DeliveryError) Error() string {
	var b strings.Builder
	if e.ID == "" {
		fmt.Fprintf(&b, "%v: %s to %s", ErrUnavailable, e.Type, e.URL)
	} else {
		fmt.Fprintf(&b, "%v: %s delivery %s to %s", ErrUnavailable, e.Type, e.ID, e.URL)
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ": answered %d %s", e.Status, http.StatusText(e.Status))
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, "; retry after %v", e.RetryAfter)
	}
	if e.Excerpt != "" {
		fmt.Fprintf(&b, ": %q", e.Excerpt)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is reports whether target is ErrUnavailable.
func (e *DeliveryError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *DeliveryError) Unwrap() error { return e.Err }

// excerptLen bounds the body excerpt of an error or a park reason.
const excerptLen = 256

// maxAnswerBytes bounds what is read of a 2xx answer (its rejection list).
const maxAnswerBytes = 8 << 20

// Sink POSTs a feed's records to a receiver; see the package doc.
type Sink struct {
	c      *config
	client *http.Client
	// signers hold one reusable HMAC state per secret.
	signers []*signer
	// target is c.url as text, parsed again by every request.
	target string
	// generation is the last generation this value published, for the
	// "generation" of incremental deliveries; 0 before the first.
	generation atomic.Int64
	closed     atomic.Bool
}

// New validates opts and checks that the receiver's address is allowed and
// accepts a TCP connection (DNS, the SSRF guard, the port), without sending
// an HTTP request: a receiver need not answer anything but deliveries.
func New(ctx context.Context, opts Options) (*Sink, error) {
	c, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	d := c.dialer()
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would be dialled instead of the receiver, past the guard
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   c.Timeout,
		ResponseHeaderTimeout: c.Timeout,
	}
	s := &Sink{c: c, target: c.url.String(), client: &http.Client{
		Transport: tr,
		// Redirects are never followed: a redirect could lead past the
		// guard's reasons (a public name answering with a private one is
		// still dialled through the guard, but a receiver moved is a
		// configuration to fix, not to follow silently).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	for _, key := range c.keys {
		s.signers = append(s.signers, newSigner(key))
	}
	port := c.url.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[c.url.Scheme]
	}
	dctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", net.JoinHostPort(c.url.Hostname(), port))
	if err != nil {
		tr.CloseIdleConnections()
		return nil, &DeliveryError{Type: "connection check", URL: c.display, Err: c.redact.err(err)}
	}
	_ = conn.Close()
	return s, nil
}

// recordReserve is what a delivery of one record may take besides the
// document: the largest envelope (type, names, generation, resync id) and a
// record's key (escaped at most six bytes to one), seq and punctuation.
const recordReserve = 160 + 2*6*feed.MaxNameLen + 6*feed.MaxKeyLen + 64

// MaxDocumentBytes is the largest document, in bytes of its JSON, the sink
// delivers: any record with one fits a delivery alone whatever its key, and
// a larger one is a rejection. It is Options.MaxBodyBytes less a fixed
// reserve for the envelope and the key.
func (s *Sink) MaxDocumentBytes() int { return s.c.MaxBodyBytes - recordReserve }

// Close ends the sink's idle connections. Safe to call more than once.
func (s *Sink) Close() error {
	s.closed.Store(true)
	s.client.CloseIdleConnections()
	return nil
}

// Apply delivers records as one or more "apply" deliveries; see the package
// doc for what a rejection and an error are.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	return s.deliverRecords(ctx, envelope{Type: TypeApply, Generation: feed.Generation(s.generation.Load())}, records)
}

// OpenResync announces a fresh copy for generation with a resync.begin
// delivery; see the package doc.
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", generation)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	r := &resync{s: s, env: envelope{Type: TypeResyncApply, Generation: generation, Resync: "rs_" + hex.EncodeToString(b[:])}}
	begin := r.env
	begin.Type = TypeResyncBegin
	if _, err := s.deliver(ctx, begin, s.header(begin), nil); err != nil {
		return nil, err
	}
	return r, nil
}

type resync struct {
	s    *Sink
	env  envelope
	mu   sync.Mutex
	done bool
	// floor is SetFloor's, 0 when it was not called: records below it are
	// not sent (only this target writes to its resync id's copy), and
	// resync.publish carries it to the receiver.
	floor feed.Seq
}

var errTargetClosed = errors.New("webhook: the resync target was already published or aborted")

func (r *resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return nil, errTargetClosed
	}
	if r.floor > 0 {
		var keep []feed.Record
		for _, rec := range records {
			if rec.Seq >= r.floor {
				keep = append(keep, rec)
			}
		}
		records = keep
	}
	return r.s.deliverRecords(ctx, r.env, records)
}

// SetFloor gives a copy that was sent no record its floor (feed.FloorSetter):
// the resync.publish delivery carries it as "floor", for the receiver to keep
// with the copy it publishes. Nothing is delivered until then.
func (r *resync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return errTargetClosed
	}
	r.floor = floor
	return nil
}

func (r *resync) Publish(ctx context.Context) error {
	return r.end(ctx, TypeResyncPublish)
}

func (r *resync) Abort(ctx context.Context) error {
	return r.end(ctx, TypeResyncAbort)
}

func (r *resync) end(ctx context.Context, typ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		if typ == TypeResyncAbort {
			return nil
		}
		return errTargetClosed
	}
	env := r.env
	env.Type = typ
	if typ == TypeResyncPublish {
		env.Floor = r.floor
	}
	if _, err := r.s.deliver(ctx, env, r.s.header(env), nil); err != nil {
		return err
	}
	r.done = true
	if typ == TypeResyncPublish {
		r.s.generation.Store(int64(r.env.Generation))
	}
	return nil
}

// envelope is a delivery's body but its records.
type envelope struct {
	Type       string
	Generation feed.Generation
	Resync     string
	Floor      feed.Seq // resync.publish's, when SetFloor gave one
}

// deliverRecords splits records into deliveries that each stay under the
// body limit and sends them in order, stopping at the first error. Each
// record is encoded once, straight into the body of its delivery.
func (s *Sink) deliverRecords(ctx context.Context, env envelope, records []feed.Record) ([]feed.Rejection, error) {
	if s.closed.Load() {
		return nil, errors.New("webhook: the sink is closed")
	}
	header := s.header(env)
	limit := s.c.MaxBodyBytes - len(closing) // what header and records may take
	estimate := len(header) + len(closing)
	for _, r := range records {
		estimate += len(r.Key) + len(r.Doc) + 48
	}
	newBody := func() []byte {
		b := getBuffer(min(estimate, s.c.MaxBodyBytes))
		return append(b, header...)
	}
	var rejs []feed.Rejection
	spans := getSpans(len(records))
	defer putSpans(spans)
	body, part := newBody(), (*spans)[:0]
	flush := func() error {
		if len(part) == 0 {
			return nil
		}
		r, err := s.deliver(ctx, env, body, part)
		rejs = append(rejs, r...)
		body, part = nil, part[:0] // deliver keeps neither
		return err
	}
	maxDoc := s.MaxDocumentBytes()
	for _, rec := range records {
		if len(rec.Doc) > maxDoc {
			rejs = append(rejs, feed.Rejection{Key: rec.Key, Seq: rec.Seq, Reason: fmt.Sprintf(
				"webhook: the document is %d bytes, more than the %d a delivery of webhook.max_body_bytes %d has room for", len(rec.Doc), maxDoc, s.c.MaxBodyBytes)})
			continue
		}
		if body == nil {
			body = newBody()
		}
		mark := len(body)
		if len(part) > 0 {
			body = append(body, ',')
		}
		start := len(body)
		body = appendRecord(body, rec)
		if len(body) <= limit {
			part = append(part, span{key: rec.Key, seq: rec.Seq, start: start, end: len(body)})
			continue
		}
		size := len(body) - start
		body = body[:mark]
		if len(header)+size > limit {
			rejs = append(rejs, feed.Rejection{Key: rec.Key, Seq: rec.Seq, Reason: fmt.Sprintf(
				"webhook: the record's JSON is %d bytes, more than a delivery of webhook.max_body_bytes %d has room for (%d)", size, s.c.MaxBodyBytes, limit-len(header))})
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		body = newBody()
		start = len(body)
		body = appendRecord(body, rec)
		part = append(part, span{key: rec.Key, seq: rec.Seq, start: start, end: len(body)})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return rejs, nil
}

// buffers keeps delivery bodies between calls: a body is as large as a
// batch's documents, and allocating one per delivery made the collector the
// sink's largest cost.
var buffers sync.Pool

func getBuffer(n int) []byte {
	if b, ok := buffers.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:0]
	}
	return make([]byte, 0, n)
}

// pooledBody is a request body that says when the transport is done with
// it: the transport closes a request's body once it has sent it or given up,
// which may be after Do returned.
type pooledBody struct {
	*bytes.Reader
	closed atomic.Bool
}

func (p *pooledBody) Close() error { p.closed.Store(true); return nil }

// release gives buf back to the pool once its request body is closed, and
// drops it otherwise (the transport may still read it).
func release(p *pooledBody, buf []byte) {
	if p.closed.Load() && cap(buf) <= 2*DefaultMaxBodyBytes {
		buffers.Put(&buf)
	}
}

// closing ends a body after its records.
const closing = "]}"

// span is one record of a delivery and where its JSON lies in the body.
type span struct {
	key        feed.Key
	seq        feed.Seq
	start, end int
}

// spanLists keeps the span lists of calls: one per record was the sink's
// largest allocation after the bodies.
var spanLists sync.Pool

func getSpans(n int) *[]span {
	if p, ok := spanLists.Get().(*[]span); ok && cap(*p) >= n {
		return p
	}
	p := make([]span, 0, n)
	return &p
}

func putSpans(p *[]span) {
	if cap(*p) <= 1<<16 {
		clear((*p)[:cap(*p)]) // drop the keys for the collector
		spanLists.Put(p)
	}
}

// appendRecord appends one record's JSON: {"key","seq","doc"} or
// {"key","seq","deleted":true}. The document is a feed document, valid JSON,
// so it goes in as it is.
func appendRecord(b []byte, r feed.Record) []byte {
	b = append(b, `{"key":`...)
	b = appendString(b, string(r.Key))
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, int64(r.Seq), 10)
	if r.Doc == nil {
		return append(b, `,"deleted":true}`...)
	}
	b = append(b, `,"doc":`...)
	b = append(b, r.Doc...)
	return append(b, '}')
}

// appendString appends s as a JSON string: as it is when it is printable
// ASCII that needs no escape, through encoding/json otherwise.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			j, _ := json.Marshal(s)
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// header is a body up to its records array's opening bracket.
func (s *Sink) header(env envelope) []byte {
	b := []byte(`{"type":"` + env.Type + `","feed":`)
	f, _ := json.Marshal(string(s.c.Feed))
	k, _ := json.Marshal(string(s.c.Sink))
	b = append(b, f...)
	b = append(b, `,"sink":`...)
	b = append(b, k...)
	if env.Generation > 0 {
		b = append(b, `,"generation":`...)
		b = strconv.AppendInt(b, int64(env.Generation), 10)
	}
	if env.Resync != "" {
		b = append(b, `,"resync":"`+env.Resync+`"`...)
	}
	if env.Floor > 0 {
		b = append(b, `,"floor":`...)
		b = strconv.AppendInt(b, int64(env.Floor), 10)
	}
	return append(b, `,"records":[`...)
}

// deliveryID is a delivery's webhook-id: a hash of what the delivery is, so
// that every retry of it carries the same id (see "Delivery ids" in the
// package doc).
// What is hashed is each field followed by a zero byte; the id is "msg_"
// and the hash's first 16 bytes in hex.
func (s *Sink) deliveryID(env envelope, part []span) string {
	var buf [512]byte // room for every field: names are at most feed.MaxNameLen
	b := append(buf[:0], "kairos-webhook/1\x00"...)
	b = append(append(b, s.c.Feed...), 0)
	b = append(append(b, s.c.Sink...), 0)
	if env.Type == TypeApply {
		b = append(b, "apply\x00"...) // seqs are unique in a feed across generations: no generation
	} else {
		b = append(append(b, env.Type...), 0)
		b = append(append(b, env.Resync...), 0)
	}
	if len(part) > 0 {
		b = append(strconv.AppendInt(b, int64(part[0].seq), 10), 0)
		b = append(strconv.AppendInt(b, int64(part[len(part)-1].seq), 10), 0)
	}
	sum := sha256.Sum256(b)
	var id [4 + 32]byte
	copy(id[:], "msg_")
	hex.Encode(id[4:], sum[:16])
	return string(id[:])
}

// sign returns the webhook-signature header for id, ts and body: one
// "v1,<base64>" per secret, space-separated.
func (s *Sink) sign(id, ts string, body []byte) string {
	out := make([]byte, 0, len(s.signers)*(4+base64.StdEncoding.EncodedLen(sha256.Size)))
	for i, sg := range s.signers {
		if i > 0 {
			out = append(out, ' ')
		}
		out = append(out, "v1,"...)
		out = sg.append(out, id, ts, body)
	}
	return string(out)
}

// signer signs under one key with HMAC states kept between deliveries:
// hmac.New hashes the key's pads each time, where Reset after the first use
// restores them from a saved state. A pool, since concurrent calls sign at
// once.
type signer struct {
	pool sync.Pool // of hash.Hash
}

func newSigner(key []byte) *signer {
	return &signer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// append appends the base64 of Standard Webhooks' v1 signature of id, ts
// and body, the same as signature's.
func (sg *signer) append(b []byte, id, ts string, body []byte) []byte {
	m := sg.pool.Get().(hash.Hash)
	defer sg.pool.Put(m)
	m.Reset()
	var pre [128]byte // id ("msg_" and 32 hex digits), ts and two dots
	m.Write(append(append(append(append(pre[:0], id...), '.'), ts...), '.'))
	m.Write(body)
	var sum [sha256.Size]byte
	return base64.StdEncoding.AppendEncode(b, m.Sum(sum[:0]))
}

// signature is Standard Webhooks' v1 signature: the base64 HMAC-SHA256 of
// "id.timestamp.body".
func signature(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// answer is a 2xx body.
type answer struct {
	Rejected []Rejected `json:"rejected"`
}

// Rejected is a receiver's refusal of one record, listed in a 2xx answer.
type Rejected struct {
	Key    feed.Key `json:"key"`
	Reason string   `json:"reason"`
}

// deliver sends one delivery and reads its answer (see "Answers" in the
// package doc).
// body holds the delivery's header and records, its end still to close;
// part says where each record lies in it.
func (s *Sink) deliver(ctx context.Context, env envelope, body []byte, part []span) ([]feed.Rejection, error) {
	body = append(body, closing...)
	id := s.deliveryID(env, part)
	fail := func(status int, excerpt string, retry time.Duration, err error) error {
		return &DeliveryError{Type: env.Type, ID: id, URL: s.c.display, Status: status, Excerpt: excerpt, RetryAfter: retry, Err: err}
	}
	rctx, cancel := context.WithTimeout(ctx, s.c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, s.target, http.NoBody)
	if err != nil {
		return nil, fail(0, "", 0, s.c.redact.err(err))
	}
	pb := &pooledBody{Reader: bytes.NewReader(body)}
	req.Body, req.ContentLength = pb, int64(len(body))
	defer release(pb, body) // after the 413 path below has cut its halves out of body
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	// The names in their canonical form, as Header.Set would write them.
	req.Header = http.Header{
		"Content-Type":      {"application/json"},
		"User-Agent":        {"kairos-webhook/1"},
		"Webhook-Id":        {id},
		"Webhook-Timestamp": {ts},
		"Webhook-Signature": {s.sign(id, ts, body)},
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fail(0, "", 0, s.c.redact.err(err))
	}
	defer resp.Body.Close()
	st := resp.StatusCode
	if st >= 200 && st < 300 {
		if resp.ContentLength == 0 {
			return nil, nil // no rejection list (204): nothing to read
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		if err != nil {
			return nil, fail(st, "", 0, fmt.Errorf("reading the answer: %w", s.c.redact.err(err)))
		}
		return s.rejections(env, id, part, raw)
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 4*excerptLen))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // reuse the connection
	excerpt := s.excerpt(head)
	if st == http.StatusRequestEntityTooLarge && len(part) > 1 {
		// The receiver's body limit is below ours: halve the delivery until
		// each piece fits, so only a record too large alone is parked.
		// Each half has its own first and last seq, hence its own id.
		_ = resp.Body.Close()
		half := len(part) / 2
		b1, p1 := s.rebody(env, body, part[:half])
		b2, p2 := s.rebody(env, body, part[half:])
		first, err := s.deliver(ctx, env, b1, p1)
		if err != nil {
			return nil, err
		}
		rest, err := s.deliver(ctx, env, b2, p2)
		return append(first, rest...), err
	}
	if parks(st) && len(part) > 0 {
		reason := fmt.Sprintf("webhook: the receiver refused the delivery %s with %d %s", id, st, http.StatusText(st))
		if excerpt != "" {
			reason += ": " + excerpt
		}
		rejs := make([]feed.Rejection, len(part))
		for i, e := range part {
			rejs[i] = feed.Rejection{Key: e.key, Seq: e.seq, Reason: reason}
		}
		return rejs, nil
	}
	return nil, fail(st, excerpt, retryAfter(resp.Header.Get("Retry-After"), time.Now()), nil)
}

// parks says whether a status other than 2xx parks a delivery's records:
// a 4xx that speaks of the delivery. 408 and 429 ask to come back later;
// 401, 403, 404, 405, 407, 410 and 421 speak of the endpoint or its
// credentials, which every batch would meet, so parking on them would empty
// the feed into the parked list while a receiver is misconfigured.
func parks(status int) bool {
	if status < 400 || status >= 500 {
		return false
	}
	switch status {
	case 401, 403, 404, 405, 407, 408, 410, 421, 425, 429:
		return false
	}
	return true
}

// rebody builds the body of a delivery of part, cut out of body.
func (s *Sink) rebody(env envelope, body []byte, part []span) ([]byte, []span) {
	out := s.header(env)
	spans := make([]span, len(part))
	for i, p := range part {
		if i > 0 {
			out = append(out, ',')
		}
		spans[i] = span{key: p.key, seq: p.seq, start: len(out)}
		out = append(out, body[p.start:p.end]...)
		spans[i].end = len(out)
	}
	return out, spans
}

// rejections reads a 2xx answer's rejection list.
func (s *Sink) rejections(env envelope, id string, part []span, raw []byte) ([]feed.Rejection, error) {
	if len(bytes.TrimSpace(raw)) == 0 || len(part) == 0 {
		return nil, nil
	}
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		// Not a rejection list: the receiver took the delivery.
		s.c.Logger.Debug("webhook receiver answered a body that is not a rejection list; taken as applied", "id", id, "url", s.c.display)
		return nil, nil
	}
	if len(a.Rejected) == 0 {
		return nil, nil
	}
	seqs := make(map[feed.Key]feed.Seq, len(part))
	for _, e := range part {
		seqs[e.key] = e.seq
	}
	out := make([]feed.Rejection, 0, len(a.Rejected))
	for _, r := range a.Rejected {
		seq, ok := seqs[r.Key]
		if !ok {
			return nil, &DeliveryError{Type: env.Type, ID: id, URL: s.c.display, Status: 200,
				Err: fmt.Errorf("the answer rejects key %q, which the delivery did not carry", s.c.redact.text(string(r.Key)))}
		}
		reason := s.c.redact.text(r.Reason)
		if reason == "" {
			reason = "rejected by the receiver, which gave no reason"
		}
		out = append(out, feed.Rejection{Key: r.Key, Seq: seq, Reason: feed.CleanReason("webhook: " + reason)})
	}
	return out, nil
}

// excerpt is a body's start as an error or a reason shows it: redacted,
// cleaned to one line, at most excerptLen bytes.
func (s *Sink) excerpt(b []byte) string {
	t := feed.CleanReason(s.c.redact.text(string(b)))
	if len(t) <= excerptLen {
		return t
	}
	cut := excerptLen
	for cut > 0 && !utf8.RuneStart(t[cut]) {
		cut--
	}
	return t[:cut] + "…"
}

// maxRetryAfter caps what a receiver's Retry-After can ask for.
const maxRetryAfter = time.Hour

// retryAfter reads a Retry-After header: seconds or an HTTP date; 0 when
// absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		d = time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now).Round(time.Second)
	}
	return max(0, min(d, maxRetryAfter))
}
