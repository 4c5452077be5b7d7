package kafka

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// broker is the Kafka a test talks to: the brokers KAIROS_TEST_KAFKA_BROKERS
// names (a comma-separated list), or else a kfake cluster in this process,
// one per test, closed at cleanup. No Kafka broker can be installed on the
// machines these tests were written on; kfake speaks the Kafka protocol,
// and every test that does not need kfake's fault injection runs the same
// against a real broker.
type broker struct {
	seeds []string
	fake  *kfake.Cluster // nil for a real broker
}

func newBroker(t testing.TB) *broker {
	t.Helper()
	if env := os.Getenv("KAIROS_TEST_KAFKA_BROKERS"); env != "" {
		seeds := strings.Split(env, ",")
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = cl.Ping(ctx)
			cancel()
			cl.Close()
		}
		if err != nil {
			pgtest.Unavailable(t, "the Kafka brokers of KAIROS_TEST_KAFKA_BROKERS", err)
		}
		return &broker{seeds: seeds}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting a kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return &broker{seeds: c.ListenAddrs(), fake: c}
}

// needFake skips a test that injects broker errors, which only kfake can,
// when the tests run against a real broker.
func (b *broker) needFake(t testing.TB) {
	t.Helper()
	if b.fake == nil {
		t.Skip("injecting a broker's error answer needs kfake; KAIROS_TEST_KAFKA_BROKERS points at a real broker")
	}
}

// topic returns a fresh base topic name and deletes, at cleanup, every
// topic of the sink's under it (its copies and its pointer topic).
func (b *broker) topic(t testing.TB) string {
	t.Helper()
	var r [6]byte
	_, _ = rand.Read(r[:])
	base := "kt-" + hex.EncodeToString(r[:])
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...))
		if err != nil {
			t.Errorf("a client to clean up %s: %v", base, err)
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adm := kadm.NewClient(cl)
		all, err := adm.ListTopics(ctx)
		if err != nil {
			t.Errorf("listing topics to clean up %s: %v", base, err)
			return
		}
		n := newNames(base)
		var mine []string
		for _, tp := range all.Names() {
			if n.ours(tp) || tp == n.pointer {
				mine = append(mine, tp)
			}
		}
		if err := deleteTopics(ctx, adm, mine...); err != nil {
			t.Errorf("cleaning up %s: %v", base, err)
		}
	})
	return base
}

// reader returns a Reader of base, closed at cleanup.
func (b *broker) reader(t testing.TB, base string) *Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := NewReader(ctx, ReaderOptions{Brokers: b.seeds, Topic: base})
	if err != nil {
		t.Fatalf("NewReader(%s): %v", base, err)
	}
	t.Cleanup(r.Close)
	return r
}

// testOptions are the options the tests build sinks with: three
// partitions, so keys spread, room for the suite's 1 MiB documents,
// records uncompressed, so a kfake fault can find a key in a request, and
// the link as the dialer.
func (b *broker) testOptions(base string, link *link) Options {
	return Options{
		Brokers: b.seeds, Feed: "orders", Topic: base, Create: true,
		Partitions: 3, MaxMessageBytes: 2 << 20,
		ClientOptions: []kgo.Opt{kgo.Dialer(link.dial), kgo.ProducerBatchCompression(kgo.NoCompression())},
	}
}

// open opens a sink, closed at cleanup.
func open(t testing.TB, opts Options) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("New(%s): %v", opts.Topic, err)
	}
	t.Cleanup(s.Close)
	return s
}

// rejectKey is the key the harness makes kfake refuse (INVALID_RECORD) in
// every produce request that carries it, whatever its document.
const rejectKey = "kfake-refuses-this-key"

// refuseKey makes the cluster answer err to every produce request whose
// records hold key, until the test ends.
func refuseKey(t testing.TB, c *kfake.Cluster, key string, err *kerr.Error) {
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: err, Count: -1, When: func(req kmsg.Request) bool {
		return produceHolds(req, key)
	}})
	t.Cleanup(h.Remove)
}

// produceHolds reports whether a produce request's (uncompressed) records
// hold key's bytes.
func produceHolds(req kmsg.Request, key string) bool {
	pr, ok := req.(*kmsg.ProduceRequest)
	if !ok {
		return false
	}
	for _, tp := range pr.Topics {
		for _, p := range tp.Partitions {
			if bytes.Contains(p.Records, []byte(key)) {
				return true
			}
		}
	}
	return false
}

func newHarness(t *testing.T) feedtest.SinkHarness {
	b := newBroker(t)
	base := b.topic(t)
	l := &link{}
	opts := b.testOptions(base, l)
	s := open(t, opts)
	r := b.reader(t, base)
	h := feedtest.SinkHarness{
		Sink: s,
		Contents: func(ctx context.Context) (map[feed.Key]json.RawMessage, error) {
			snap, err := r.Read(ctx)
			return snap.Docs, err
		},
		ConditionalOnSeq: true, // for readers that read through Reader: see doc.go
		AtomicPublish:    true,
		MaxDocumentBytes: s.MaxDocumentBytes(),
		Fault:            func(t *testing.T) func() { return l.down() },
		Reopen:           func(t *testing.T) feed.Sink { return open(t, opts) },
	}
	if b.fake != nil {
		h.RejectKey = rejectKey
		refuseKey(t, b.fake, rejectKey, kerr.InvalidRecord)
	}
	return h
}

// link is a sink's way to its brokers: a test takes it down (its
// connections closed, new ones refused) and brings it back.
type link struct {
	mu     sync.Mutex
	isDown bool
	conns  []net.Conn
}

var errLinkDown = errors.New("the test took the link down")

func (l *link) dial(ctx context.Context, network, host string) (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isDown {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errLinkDown}
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	l.conns = append(l.conns, c)
	return c, nil
}

func (l *link) down() (restore func()) {
	l.mu.Lock()
	l.isDown = true
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.isDown = false
		l.mu.Unlock()
	}
}
