package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/sinks/webhook"
)

const rejectKey = feed.Key("reject-me")

func opts(url string) webhook.Options {
	return webhook.Options{URL: url, Secrets: []string{testSecret}, Feed: "orders", Sink: "hook", AllowLoopback: true, Timeout: 5 * time.Second}
}

func newSink(t *testing.T, o webhook.Options) *webhook.Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := webhook.New(ctx, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func rec(k string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(k), Seq: seq}
	if doc != "" {
		r.Doc = []byte(doc)
	}
	return r
}

// TestRunSink holds the sink and the receiver model of the package doc
// (receiver_test.go) to the sink suite, over real HTTP on 127.0.0.1. The
// seq guard is the receiver's, which this one keeps, so the suite checks it;
// so is the atomic publish (the receiver swaps its copy under one lock). The
// body limit, the sink's and the receiver's, is raised to 8 MiB, past the
// suite's 1 MiB documents and low enough for the suite to send one over it;
// a fault makes the receiver answer 503; a reopened sink is a new one over
// the same URL.
func TestRunSink(t *testing.T) {
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		rc := newReceiver(t)
		rc.rejectKey = rejectKey
		rc.maxBody = 8 << 20
		_, url := rc.serve(t)
		o := opts(url)
		o.MaxBodyBytes = int(rc.maxBody)
		// Bodies near 8 MiB, signed and parsed under -race on a loaded
		// machine, can outlast the 5 s the other tests allow; the fault
		// here is a 503, answered at once, so no subtest waits on it.
		o.Timeout = 30 * time.Second
		s := newSink(t, o)
		return feedtest.SinkHarness{
			Sink: s, Contents: rc.contents, ConditionalOnSeq: true, RejectKey: rejectKey,
			AtomicPublish:    true,
			MaxDocumentBytes: s.MaxDocumentBytes(),
			Fault: func(*testing.T) func() {
				rc.setFault(func(w http.ResponseWriter) bool {
					http.Error(w, "down", http.StatusServiceUnavailable)
					return true
				})
				return func() { rc.setFault(nil) }
			},
			Reopen: func(t *testing.T) feed.Sink { return newSink(t, o) },
		}
	})
}

// TestSignatures checks every delivery's signature with an implementation of
// the Standard Webhooks spec written in the test, one signature per secret
// when two are configured (rotation), and with Verify.
func TestSignatures(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	const second = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24="
	o := opts(url)
	o.Secrets = append(o.Secrets, second)
	s := newSink(t, o)
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `{"v":"ü"}`), rec("b", 2, "")}); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenResync(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Apply(t.Context(), []feed.Record{rec("c", 3, `3`)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.hdrs) != 4 {
		t.Fatalf("%d deliveries, want 4", len(rc.hdrs))
	}
	for i, h := range rc.hdrs {
		for _, sec := range []string{testSecret, second} {
			if err := standardVerify(sec, h, rc.bodies[i]); err != nil {
				t.Errorf("delivery %d, secret %d: the spec's verification fails: %v", i, len(sec), err)
			}
			if err := webhook.Verify(sec, h, rc.bodies[i], 0); err != nil {
				t.Errorf("delivery %d: Verify: %v", i, err)
			}
		}
		if n := len(strings.Fields(h.Get("webhook-signature"))); n != 2 {
			t.Errorf("delivery %d has %d signatures, want 2", i, n)
		}
		tampered := append(bytes.Clone(rc.bodies[i]), ' ')
		if err := webhook.Verify(testSecret, h, tampered, 0); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("delivery %d: Verify of a tampered body = %v, want ErrSignature", i, err)
		}
		if err := webhook.Verify("whsec_d3Jvbmctc2VjcmV0LWZvci10ZXN0cw==", h, rc.bodies[i], 0); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("delivery %d: Verify under another secret = %v, want ErrSignature", i, err)
		}
	}
	var types []string
	for _, b := range rc.bodies {
		d, err := webhook.Decode("", b)
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, d.Type)
		if d.Feed != "orders" || d.Sink != "hook" {
			t.Errorf("a %s delivery names %s/%s", d.Type, d.Feed, d.Sink)
		}
		if strings.HasPrefix(d.Type, "resync") && (d.Generation != 3 || d.Resync == "") {
			t.Errorf("a %s delivery has generation %d, resync %q", d.Type, d.Generation, d.Resync)
		}
	}
	if got := strings.Join(types, " "); got != "apply resync.begin resync.apply resync.publish" {
		t.Errorf("delivery types %s", got)
	}
}

// TestRetriesKeepTheirID: a batch the receiver answered 503 for is sent again
// by the worker with the same webhook-id, by this sink value and by a new one
// (a lease change, a restart); a receiver that dedupes by id applies it once
// and answers a repeat as it answered the first time, rejections included.
func TestRetriesKeepTheirID(t *testing.T) {
	rc := newReceiver(t)
	rc.rejectKey = rejectKey
	_, url := rc.serve(t)
	s := newSink(t, opts(url))
	batch := []feed.Record{rec("a", 10, `1`), rec(string(rejectKey), 11, `2`), rec("c", 12, "")}
	fails := 2
	rc.setFault(func(w http.ResponseWriter) bool {
		if fails == 0 {
			return false
		}
		fails--
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return true
	})
	for i := range 2 {
		_, err := s.Apply(t.Context(), batch)
		var de *webhook.DeliveryError
		if !errors.As(err, &de) || de.Status != 503 || !errors.Is(err, webhook.ErrUnavailable) {
			t.Fatalf("try %d: Apply = %v; want a 503 DeliveryError", i, err)
		}
	}
	for i, sink := range []*webhook.Sink{s, s, newSink(t, opts(url))} {
		rejs, err := sink.Apply(t.Context(), batch)
		if err != nil || len(rejs) != 1 || rejs[0].Key != rejectKey || rejs[0].Seq != 11 {
			t.Fatalf("send %d: Apply = %+v, %v; want the one rejection", i, rejs, err)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.ids) != 1 {
		t.Fatalf("the receiver saw %d ids, want 1: %v", len(rc.ids), rc.ids)
	}
	for id, n := range rc.ids {
		if n != 3 || rc.applied[id] != 1 {
			t.Errorf("id %s: seen %d times (want 3), applied %d (want 1)", id, n, rc.applied[id])
		}
	}
}

// TestDeliveryIDs pins how a webhook-id is derived, computed here from the
// package doc's description: a receiver deduplicating across an upgrade of
// the sender (a new lease holder running a newer build) relies on it not
// changing between versions.
func TestDeliveryIDs(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	s := newSink(t, opts(url))
	want := func(fields ...string) string {
		h := sha256.New()
		for _, f := range append([]string{"kairos-webhook/1", "orders", "hook"}, fields...) {
			h.Write([]byte(f))
			h.Write([]byte{0})
		}
		return "msg_" + hex.EncodeToString(h.Sum(nil)[:16])
	}
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 10, `1`), rec("b", 11, ""), rec("c", 12, `3`)}); err != nil {
		t.Fatal(err)
	}
	rt, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Apply(t.Context(), []feed.Record{rec("a", 13, `1`)}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bodies) != 4 {
		t.Fatalf("%d deliveries, want 4", len(rc.bodies))
	}
	d, err := webhook.Decode("", rc.bodies[1])
	if err != nil || d.Resync == "" {
		t.Fatalf("the resync.begin body: %+v, %v", d, err)
	}
	for i, w := range []string{
		want("apply", "10", "12"),
		want(webhook.TypeResyncBegin, d.Resync),
		want(webhook.TypeResyncApply, d.Resync, "13", "13"),
		want(webhook.TypeResyncPublish, d.Resync),
	} {
		if got := rc.hdrs[i].Get("webhook-id"); got != w {
			t.Errorf("delivery %d: webhook-id %s, want %s", i, got, w)
		}
	}
}

// TestPublishCarriesFloor: SetFloor's floor goes to the receiver on the
// resync.publish delivery, as "floor", and the target sends no record below
// it; a resync not given one publishes with no "floor" field at all, as
// before, so a receiver that predates the field sees the same bodies.
func TestPublishCarriesFloor(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	s := newSink(t, opts(url))
	ctx := t.Context()
	rt, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.(feed.FloorSetter).SetFloor(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Apply(ctx, []feed.Record{rec("a", 5, `1`), rec("b", 8, `2`)}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	rt, err = s.OpenResync(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bodies) != 5 {
		t.Fatalf("%d deliveries, want 5 (begin, apply, publish, begin, publish)", len(rc.bodies))
	}
	d, err := webhook.Decode("", rc.bodies[1])
	if err != nil || len(d.Records) != 1 || d.Records[0].Seq != 8 {
		t.Errorf("the resync.apply after SetFloor(7): %+v, %v; want seq 8 alone", d.Records, err)
	}
	d, err = webhook.Decode("", rc.bodies[2])
	if err != nil || d.Type != webhook.TypeResyncPublish || d.Floor != 7 {
		t.Errorf("the resync.publish after SetFloor(7): %s (%+v, %v); want floor 7", rc.bodies[2], d, err)
	}
	if b := string(rc.bodies[4]); strings.Contains(b, `"floor"`) {
		t.Errorf("the resync.publish of a resync given no floor: %s; want no floor field", b)
	}
}

// TestAnswers: other 4xx park the delivery's records with the status and a
// bounded, one-line excerpt; 429 is an error saying how long to wait; the
// statuses that speak of the endpoint (401, 403, 404, 405, 407, 410, 421),
// those that ask to come back (408, 425, 5xx) and every 3xx are errors,
// never parks; a dropped connection is an error.
func TestAnswers(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	s := newSink(t, opts(url))
	batch := []feed.Record{rec("a", 1, `1`), rec("b", 2, "")}
	answer := func(status int, body string, hdr ...string) {
		rc.setFault(func(w http.ResponseWriter) bool {
			for i := 0; i < len(hdr); i += 2 {
				w.Header().Set(hdr[i], hdr[i+1])
			}
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
			return true
		})
	}
	long := "line one\nline two\t" + strings.Repeat("x", 10_000)
	answer(422, long)
	rejs, err := s.Apply(t.Context(), batch)
	if err != nil || len(rejs) != 2 {
		t.Fatalf("422: Apply = %+v, %v; want both records rejected", rejs, err)
	}
	for _, r := range rejs {
		if !strings.Contains(r.Reason, "422") || !strings.Contains(r.Reason, "line one line two") || len(r.Reason) > 512 || strings.ContainsAny(r.Reason, "\n\t") {
			t.Errorf("422 reason %q: want the status and a bounded one-line excerpt", r.Reason)
		}
	}

	answer(429, "slow down", "Retry-After", "7")
	_, err = s.Apply(t.Context(), batch)
	var de *webhook.DeliveryError
	if !errors.As(err, &de) || de.Status != 429 || de.RetryAfter != 7*time.Second || !strings.Contains(err.Error(), "retry after 7s") {
		t.Errorf("429: Apply = %v; want a DeliveryError asking for 7s", err)
	}
	if d := feed.RetryDelay(fmt.Errorf("worker: %w", err)); d != 7*time.Second {
		t.Errorf("429: feed.RetryDelay = %v; want the 7s the driver must wait", d)
	}
	for _, st := range []int{401, 403, 404, 405, 407, 410, 421, 408, 425, 500, 502, 503, 504,
		300, 301, 302, 303, 304, 307, 308} {
		answer(st, "no", "Location", "http://127.0.0.1:1/elsewhere")
		rejs, err := s.Apply(t.Context(), batch)
		if !errors.As(err, &de) || de.Status != st || len(rejs) != 0 {
			t.Errorf("%d: Apply = %+v, %v; want an error with the status, no rejection", st, rejs, err)
		}
	}
	rc.setFault(func(w http.ResponseWriter) bool {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.(*net.TCPConn).SetLinger(0) // a reset
			_ = conn.Close()
		}
		return true
	})
	if rejs, err := s.Apply(t.Context(), batch); !errors.Is(err, webhook.ErrUnavailable) || len(rejs) != 0 {
		t.Errorf("a reset: Apply = %+v, %v; want ErrUnavailable", rejs, err)
	}
	answer(200, `{"rejected":[{"key":"nope","reason":"x"}]}`)
	if _, err := s.Apply(t.Context(), batch); !errors.Is(err, webhook.ErrUnavailable) {
		t.Errorf("a rejection of a key not sent: Apply = %v; want an error", err)
	}
	answer(204, "")
	if rejs, err := s.Apply(t.Context(), batch); err != nil || len(rejs) != 0 {
		t.Errorf("204: Apply = %+v, %v; want applied", rejs, err)
	}
}

// TestTimeout: a receiver that does not answer within Options.Timeout is an
// error.
func TestTimeout(t *testing.T) {
	rc := newReceiver(t)
	release := make(chan struct{})
	srv, url := rc.serve(t)
	rc.setFault(func(w http.ResponseWriter) bool { <-release; return true })
	o := opts(url)
	o.Timeout = 200 * time.Millisecond
	s := newSink(t, o)
	_, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `1`)})
	close(release)
	srv.CloseClientConnections()
	if !errors.Is(err, webhook.ErrUnavailable) {
		t.Errorf("Apply = %v; want ErrUnavailable", err)
	}
}

// TestBodyLimit: a batch is split into deliveries under MaxBodyBytes; a
// document of MaxDocumentBytes goes, even under the longest key of escaped
// characters, and one byte more is rejected, the rest applied.
func TestBodyLimit(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	o := opts(url)
	o.MaxBodyBytes = webhook.MinMaxBodyBytes
	s := newSink(t, o)
	maxDoc := s.MaxDocumentBytes()
	if maxDoc < 8<<10 {
		t.Fatalf("MaxDocumentBytes = %d under a %d body limit", maxDoc, o.MaxBodyBytes)
	}
	str := func(n int) string { return `"` + strings.Repeat("x", n-2) + `"` }
	var batch []feed.Record
	for i := range 60 {
		batch = append(batch, rec(fmt.Sprintf("k%03d", i), feed.Seq(i+1), `{"pad":"`+strings.Repeat("p", 1000)+`"}`))
	}
	longKey := strings.Repeat("\x01", feed.MaxKeyLen) // each escaped to six bytes
	batch[10] = rec(longKey, 11, str(maxDoc))
	batch[20] = rec("big", 21, str(maxDoc+1))
	rejs, err := s.Apply(t.Context(), batch)
	if err != nil || len(rejs) != 1 || rejs[0].Key != "big" || rejs[0].Seq != 21 {
		t.Fatalf("Apply = %+v, %v; want the big record rejected", rejs, err)
	}
	got, _ := rc.contents(t.Context())
	if len(got) != 59 || got[feed.Key(longKey)] == nil {
		t.Errorf("the receiver holds %d documents, want 59 with the longest key's", len(got))
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bodies) < 4 {
		t.Errorf("%d deliveries; want the batch split", len(rc.bodies))
	}
	for i, b := range rc.bodies {
		if len(b) > o.MaxBodyBytes {
			t.Errorf("delivery %d is %d bytes, over the limit", i, len(b))
		}
	}
}

// TestSSRFGuard: with loopback not allowed, New refuses addresses the guard
// blocks, names resolving to them included, before connecting. Only loopback
// could be reached from here, and the others are refused by the dialer's
// Control, which runs before connect: the test only asserts the refusal.
func TestSSRFGuard(t *testing.T) {
	for _, u := range []string{
		"http://127.0.0.1:9/hook", "http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data",
		"http://[::1]:9/hook", "http://localhost:9/hook", "http://192.168.1.1/", "http://[fd00:ec2::254]/",
		"http://[::ffff:127.0.0.1]:9/", "http://0.0.0.0:9/", "http://100.100.100.200/",
	} {
		o := opts(u)
		o.AllowLoopback = false
		o.Timeout = 2 * time.Second
		_, err := webhook.New(t.Context(), o)
		if !errors.Is(err, webhook.ErrBlockedAddress) {
			t.Errorf("New(%s) = %v; want ErrBlockedAddress", u, err)
		}
	}
	// Loopback allowed lifts loopback only.
	o := opts("http://10.0.0.1/hook")
	if _, err := webhook.New(t.Context(), o); !errors.Is(err, webhook.ErrBlockedAddress) {
		t.Errorf("New(10.0.0.1) with loopback allowed = %v; want ErrBlockedAddress", err)
	}
}

// TestNoRedirect: a 3xx is not followed.
func TestNoRedirect(t *testing.T) {
	rc := newReceiver(t)
	_, url := rc.serve(t)
	other := newReceiver(t)
	_, otherURL := other.serve(t)
	rc.setFault(func(w http.ResponseWriter) bool {
		w.Header().Set("Location", otherURL)
		w.WriteHeader(http.StatusTemporaryRedirect)
		return true
	})
	s := newSink(t, opts(url))
	if _, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `1`)}); err == nil {
		t.Error("Apply through a redirect succeeded")
	}
	other.mu.Lock()
	defer other.mu.Unlock()
	if len(other.bodies) != 0 {
		t.Error("the redirect was followed")
	}
}

// TestSecretsNeverEchoed plants a canary as the URL's password and query
// token, makes the receiver answer with it, and looks for it in every error,
// park reason and log line.
func TestSecretsNeverEchoed(t *testing.T) {
	const canary = "CANARY7f3a9"
	// basic is the credentials as the Authorization header carries them,
	// which a receiver may repeat as readily as the URL's token.
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + canary + "pw"))
	rc := newReceiver(t)
	srv, _ := rc.serve(t)
	url := strings.Replace(srv.URL, "http://", "http://user:"+canary+"pw@", 1) + "/hook?token=" + canary + "tok&x=1"
	var logs syncBuffer
	o := opts(url)
	o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := newSink(t, o)
	var said []string
	check := func(rejs []feed.Rejection, err error) {
		if err != nil {
			said = append(said, err.Error())
		}
		for _, r := range rejs {
			said = append(said, r.Reason)
		}
	}
	batch := []feed.Record{rec("a", 1, `1`)}
	for _, st := range []int{400, 503, 200} {
		rc.setFault(func(w http.ResponseWriter) bool {
			w.WriteHeader(st)
			_, _ = w.Write([]byte("you sent " + canary + "pw and " + canary + "tok, " + canary + "tok again, as Basic " + basic))
			return true
		})
		check(s.Apply(t.Context(), batch))
	}
	rc.setFault(func(w http.ResponseWriter) bool {
		_, _ = w.Write([]byte(`{"rejected":[{"key":"a","reason":"token ` + canary + `tok refused"}]}`))
		return true
	})
	check(s.Apply(t.Context(), batch))
	srv.Close()
	check(s.Apply(t.Context(), batch))
	_, err := webhook.New(t.Context(), o) // the server is gone
	check(nil, err)
	bad := o
	bad.URL = "ftp://u:" + canary + "pw@example.com/?token=" + canary + "tok"
	_, err = webhook.New(t.Context(), bad)
	check(nil, err)
	said = append(said, logs.String())
	if len(said) < 6 {
		t.Fatalf("only %d things said: %q", len(said), said)
	}
	for _, s := range said {
		if strings.Contains(s, canary) || strings.Contains(s, basic) {
			t.Errorf("the canary leaked: %s", s)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestBadOptions: every input a caller can get wrong is refused with the
// field named, and never repeats a secret.
func TestBadOptions(t *testing.T) {
	good := opts("http://127.0.0.1:9/hook")
	cases := []struct {
		field string
		edit  func(o *webhook.Options)
	}{
		{"webhook.url", func(o *webhook.Options) { o.URL = "" }},
		{"webhook.url", func(o *webhook.Options) { o.URL = "127.0.0.1:8080/hook" }},
		{"webhook.url", func(o *webhook.Options) { o.URL = "example.com/hook" }},
		{"webhook.url", func(o *webhook.Options) { o.URL = "ftp://example.com/" }},
		{"webhook.url", func(o *webhook.Options) { o.URL = "http:///nohost" }},
		{"webhook.secrets", func(o *webhook.Options) { o.Secrets = nil }},
		{"webhook.secrets[0]", func(o *webhook.Options) { o.Secrets = []string{""} }},
		{"webhook.secrets[0]", func(o *webhook.Options) { o.Secrets = []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"} }},
		{"webhook.secrets[1]", func(o *webhook.Options) { o.Secrets = []string{testSecret, "whsec_not base64!"} }},
		{"webhook.secrets[0]", func(o *webhook.Options) { o.Secrets = []string{"whsec_c2hvcnQ="} }},
		{"webhook.feed", func(o *webhook.Options) { o.Feed = "" }},
		{"webhook.sink", func(o *webhook.Options) { o.Sink = "a b" }},
		{"webhook.timeout", func(o *webhook.Options) { o.Timeout = -time.Second }},
		{"webhook.max_body_bytes", func(o *webhook.Options) { o.MaxBodyBytes = 10 }},
		{"webhook.max_body_bytes", func(o *webhook.Options) { o.MaxBodyBytes = webhook.MinMaxBodyBytes - 1 }},
	}
	for _, c := range cases {
		o := good
		c.edit(&o)
		_, err := webhook.New(t.Context(), o)
		var ie *feed.InvalidError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("%+v: New = %v; want an InvalidError for %s", o, err, c.field)
			continue
		}
		if strings.Contains(err.Error(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") {
			t.Errorf("the error repeats the secret: %v", err)
		}
	}
	if _, err := webhook.NewHandler(nil, webhook.HandlerOptions{}, nil); !errors.Is(err, feed.ErrInvalid) {
		t.Errorf("NewHandler without secrets = %v", err)
	}
}

// TestGuardClasses: the guard's verdicts, IPv4-mapped IPv6 forms included
// (the dialer rewrites those before the guard sees them, so this asks the
// guard directly).
func TestGuardClasses(t *testing.T) {
	for a, want := range map[string]string{
		"127.0.0.1": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
		"::ffff:10.0.0.1": "private", "10.1.2.3": "private", "172.16.0.1": "private", "192.168.0.1": "private",
		"100.64.0.1": "private", "169.254.169.254": "cloud-metadata", "::ffff:169.254.169.254": "cloud-metadata",
		"169.254.1.1": "link-local", "fe80::1": "link-local", "fc00::1": "unique-local", "fd00:ec2::254": "cloud-metadata",
		"0.0.0.0": "unspecified", "::": "unspecified", "224.0.0.1": "multicast or broadcast",
		"8.8.8.8": "", "2001:4860:4860::8888": "",
	} {
		if got := webhook.Classify(netip.MustParseAddr(a), false, false); got != want {
			t.Errorf("classify(%s) = %q, want %q", a, got, want)
		}
	}
	if got := webhook.Classify(netip.MustParseAddr("10.0.0.1"), true, false); got != "private" {
		t.Errorf("loopback allowed lifts private: %q", got)
	}
	if got := webhook.Classify(netip.MustParseAddr("169.254.169.254"), false, true); got != "" {
		t.Errorf("private allowed keeps metadata refused: %q", got)
	}
}

// TestVerifyTimestamp: a delivery signed right but stamped outside the
// tolerance is refused (a replay), one inside is taken; the handler answers
// 401 to an unsigned POST.
func TestVerifyTimestamp(t *testing.T) {
	body := []byte(`{"type":"apply","feed":"f","sink":"s","records":[]}`)
	signed := func(ts time.Time) http.Header {
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
		s := strconv.FormatInt(ts.Unix(), 10)
		mac := hmac.New(sha256.New, key)
		fmt.Fprintf(mac, "msg_1.%s.%s", s, body)
		h := http.Header{}
		h.Set("webhook-id", "msg_1")
		h.Set("webhook-timestamp", s)
		h.Set("webhook-signature", "v1,bm90IGl0 v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		return h
	}
	if err := webhook.Verify(testSecret, signed(time.Now().Add(-time.Minute)), body, 0); err != nil {
		t.Errorf("a minute old: %v", err)
	}
	for _, d := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
		if err := webhook.Verify(testSecret, signed(time.Now().Add(d)), body, 0); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("%v away: Verify = %v, want ErrSignature", d, err)
		}
	}
	if err := webhook.Verify(testSecret, signed(time.Now().Add(-10*time.Minute)), body, time.Hour); err != nil {
		t.Errorf("10 minutes old within an hour's tolerance: %v", err)
	}
	rc := newReceiver(t)
	_, url := rc.serve(t)
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an unsigned POST was answered %d, want 401", resp.StatusCode)
	}
}

// TestReceiverBodyLimit: a receiver whose body limit is below the sink's
// answers 413; the sink halves the delivery until the pieces fit and parks
// only the record too large alone.
func TestReceiverBodyLimit(t *testing.T) {
	rc := newReceiver(t)
	srv, url := rc.serve(t)
	h, err := webhook.NewHandler([]string{testSecret}, webhook.HandlerOptions{MaxBodyBytes: 2000}, rc.receive)
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = h
	s := newSink(t, opts(url))
	var batch []feed.Record
	for i := range 16 {
		batch = append(batch, rec(fmt.Sprintf("k%02d", i), feed.Seq(i+1), `"`+strings.Repeat("p", 300)+`"`))
	}
	batch[5] = rec("big", 6, `"`+strings.Repeat("x", 3000)+`"`)
	rejs, err := s.Apply(t.Context(), batch)
	if err != nil || len(rejs) != 1 || rejs[0].Key != "big" || !strings.Contains(rejs[0].Reason, "413") {
		t.Fatalf("Apply = %+v, %v; want only the big record parked with 413", rejs, err)
	}
	if got, _ := rc.contents(t.Context()); len(got) != 15 {
		t.Errorf("the receiver holds %d documents, want 15", len(got))
	}

	// A receiver answering 413 to everything: a delivery of four records is
	// sent as 4, then 2 and 2, then 1, 1, 1 and 1, each single record parked
	// with the status, and nothing is an error.
	var (
		mu    sync.Mutex
		sizes []int
	)
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d, err := webhook.Decode(r.Header.Get("webhook-id"), body)
		if err != nil {
			t.Errorf("decoding a delivery: %v", err)
		}
		mu.Lock()
		sizes = append(sizes, len(d.Records))
		mu.Unlock()
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	})
	four := []feed.Record{rec("a", 101, `1`), rec("b", 102, `2`), rec("c", 103, ""), rec("d", 104, `4`)}
	rejs, err = s.Apply(t.Context(), four)
	if err != nil || len(rejs) != 4 {
		t.Fatalf("413 to everything: Apply = %+v, %v; want the four records parked", rejs, err)
	}
	for i, r := range rejs {
		if r.Key != four[i].Key || r.Seq != four[i].Seq || !strings.Contains(r.Reason, "413") {
			t.Errorf("rejection %d = %+v; want %s at %d with the status", i, r, four[i].Key, four[i].Seq)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int{4, 2, 1, 1, 2, 1, 1}; fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Errorf("deliveries of %v records; want %v (halved down to single records)", sizes, want)
	}
}

// TestFaultAndReopen is what the extended suite's Fault and Reopen fields
// will ask, until they exist: while the receiver answers 503 or drops
// connections, Apply, a resync's Apply and Publish are errors, never
// rejections, and the same batch after the fault leaves everything; a new
// sink over the same URL opening a resync for a generation a crashed one
// left half-filled starts it empty.
func TestFaultAndReopen(t *testing.T) {
	for _, fault := range []string{"503", "drop"} {
		t.Run(fault, func(t *testing.T) {
			rc := newReceiver(t)
			_, url := rc.serve(t)
			s := newSink(t, opts(url))
			r, err := s.OpenResync(t.Context(), 2)
			if err != nil {
				t.Fatal(err)
			}
			rc.setFault(func(w http.ResponseWriter) bool {
				if fault == "503" {
					http.Error(w, "down", http.StatusServiceUnavailable)
				} else if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = conn.Close()
				}
				return true
			})
			batch := []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`)}
			if rejs, err := s.Apply(t.Context(), batch); err == nil || len(rejs) != 0 {
				t.Errorf("Apply under the fault = %v, %v; want an error", rejs, err)
			}
			if rejs, err := r.Apply(t.Context(), batch); err == nil || len(rejs) != 0 {
				t.Errorf("resync Apply under the fault = %v, %v; want an error", rejs, err)
			}
			if err := r.Publish(t.Context()); err == nil {
				t.Error("Publish under the fault succeeded")
			}
			rc.setFault(nil)
			if rejs, err := s.Apply(t.Context(), batch); err != nil || len(rejs) != 0 {
				t.Fatalf("Apply after the fault = %v, %v", rejs, err)
			}
			if got, _ := rc.contents(t.Context()); len(got) != 2 {
				t.Errorf("after the fault the receiver holds %v", got)
			}
			// A crash half-way through a resync of generation 3, then a
			// new process.
			half, err := s.OpenResync(t.Context(), 3)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := half.Apply(t.Context(), []feed.Record{rec("stale", 3, `3`)}); err != nil {
				t.Fatal(err)
			}
			again, err := newSink(t, opts(url)).OpenResync(t.Context(), 3)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := again.Apply(t.Context(), []feed.Record{rec("fresh", 4, `4`)}); err != nil {
				t.Fatal(err)
			}
			if err := again.Publish(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got, _ := rc.contents(t.Context()); len(got) != 1 || got["fresh"] == nil {
				t.Errorf("after the reopened resync the receiver holds %v, want only fresh", got)
			}
		})
	}
}

// TestRetryAfterForms: seconds, an HTTP date, nonsense and a cap.
func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"12":                            12 * time.Second,
		" 3 ":                           3 * time.Second,
		"-4":                            0,
		"soon":                          0,
		"Fri, 02 Jan 2026 03:04:35 GMT": 30 * time.Second,
		"Fri, 02 Jan 2026 03:00:00 GMT": 0, // past
		"99999999":                      time.Hour,
	} {
		if got := webhook.RetryAfter(v, now); got != want {
			t.Errorf("Retry-After %q = %v, want %v", v, got, want)
		}
	}
}
