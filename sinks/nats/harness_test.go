package nats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// DefaultTestURL is the NATS server tests use when KAIROS_TEST_NATS_URL is
// unset.
const DefaultTestURL = "nats://127.0.0.1:4222"

func testURL() string {
	if u := os.Getenv("KAIROS_TEST_NATS_URL"); u != "" {
		return u
	}
	return DefaultTestURL
}

// faultLink is one connection's way to the server: a dialer the test can
// cut (its connections closed, new ones sent to a closed port) and restore.
type faultLink struct {
	real, closed string
	mu           sync.Mutex
	down         bool
	conns        []net.Conn
}

func newLink(t testing.TB) *faultLink {
	u, err := url.Parse(strings.Split(testURL(), ",")[0])
	if err != nil {
		t.Fatalf("parsing KAIROS_TEST_NATS_URL: %v", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	return &faultLink{real: host, closed: pgtest.ClosedPort(t)}
}

// Dial is nats.CustomDialer's: whatever address the client asks for, it
// dials the test server, or the closed port while the link is down.
func (l *faultLink) Dial(network, _ string) (net.Conn, error) {
	l.mu.Lock()
	addr := l.real
	if l.down {
		addr = l.closed
	}
	l.mu.Unlock()
	c, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		c.Close()
		return nil, errors.New("test: the link went down while dialling")
	}
	l.conns = append(l.conns, c)
	return c, nil
}

// Down cuts the link: its connections are closed under the client, and its
// redials fail. restore lets them through and waits until every connection
// in conns is connected again, so that the next call meets a live server.
func (l *faultLink) Down(t testing.TB, conns ...*nats.Conn) (restore func()) {
	l.mu.Lock()
	l.down = true
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.down = false
		l.mu.Unlock()
		deadline := time.Now().Add(15 * time.Second)
		for _, nc := range conns {
			for !nc.IsConnected() {
				if time.Now().After(deadline) {
					t.Errorf("test: the connection did not come back within 15 s (status %v)", nc.Status())
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// connect opens a connection through link (a fresh one when nil), closed at
// cleanup; a server that cannot be reached is pgtest.Unavailable.
func connect(t testing.TB, link *faultLink) *nats.Conn {
	t.Helper()
	if link == nil {
		link = newLink(t)
	}
	nc, err := nats.Connect(testURL(), nats.SetCustomDialer(link), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0), nats.ReconnectBufSize(-1),
		nats.Timeout(2*time.Second), nats.Name("kairos nats sink test"))
	if err != nil {
		pgtest.Unavailable(t, "the NATS server", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// bucketName returns a fresh Options.Bucket and removes, at cleanup, every
// bucket of that sink: its pointer and its copies.
func bucketName(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kt_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		nc, err := nats.Connect(testURL(), nats.Timeout(5*time.Second))
		if err != nil {
			t.Errorf("removing the buckets of %s: %v", name, err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, b := range bucketsOf(t, js, name) {
			if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				t.Errorf("removing the bucket %s: %v", b, err)
			}
		}
	})
	return name
}

// bucketsOf lists the pointer bucket name and its copies.
func bucketsOf(t testing.TB, js jetstream.JetStream, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := js.KeyValueStoreNames(ctx)
	var out []string
	for b := range l.Name() {
		if b == name || strings.HasPrefix(b, name+"-g") {
			out = append(out, b)
		}
	}
	if err := l.Error(); err != nil {
		t.Fatalf("listing buckets: %v", err)
	}
	return out
}

// openSink builds a sink named bucket over nc, closed at cleanup.
func openSink(t testing.TB, nc *nats.Conn, opts Options) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := New(ctx, nc, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func newReader(t testing.TB, nc *nats.Conn, bucket string) *Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := NewReader(ctx, nc, bucket)
	if err != nil {
		t.Fatalf("NewReader: %v", err)
	}
	return r
}

func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	switch {
	case err == nil:
		t.Errorf("%s: no error, want one naming %q", what, field)
	case !errors.As(err, &inv) || !errors.Is(err, feed.ErrInvalid):
		t.Errorf("%s: %v (%T), want an *feed.InvalidError", what, err, err)
	case inv.Field != field:
		t.Errorf("%s: the error names %q (%v), want %q", what, inv.Field, err, field)
	}
}

func rec(key string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if doc != "" {
		r.Doc = json.RawMessage(doc)
	}
	return r
}

func applyOK(t testing.TB, s interface {
	Apply(context.Context, []feed.Record) ([]feed.Rejection, error)
}, records ...feed.Record) {
	t.Helper()
	rej, err := s.Apply(t.Context(), records)
	if err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v; want no rejection and no error", rej, err)
	}
}

type natsConn = nats.Conn

// connectOnce is a connection for tests that only need one to hand to New.
func connectOnce(t testing.TB) *nats.Conn { return connect(t, nil) }

func pgtestClosedPort(t testing.TB) string { return pgtest.ClosedPort(t) }
