package pgfeed_test

import (
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// stallProxy forwards TCP to the test database until stalled; then it stops
// moving bytes either way, as a network partition does, while keeping both
// connections open. With a delay set, every chunk the client sends reaches
// the server that much later, as over a slow link.
type stallProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	stalled bool
	done    bool
	delay   time.Duration
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s, false)
		go p.pipe(s, c, true)
	}
}

func (p *stallProxy) pipe(dst, src net.Conn, up bool) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for n > 0 && p.isStalled() {
			if p.shutDown() {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if d := p.upDelay(); n > 0 && up && d > 0 {
			time.Sleep(d) // a slow link, not a wait for a condition
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) isStalled() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.stalled }
func (p *stallProxy) upDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}
func (p *stallProxy) setDelay(d time.Duration) { p.mu.Lock(); p.delay = d; p.mu.Unlock() }
func (p *stallProxy) stall()                   { p.mu.Lock(); p.stalled = true; p.mu.Unlock() }

// shutDown reports whether close has run.
func (p *stallProxy) shutDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.done = true
	p.mu.Unlock()
	p.wg.Wait()
}

// TestAdvisoryStalledSession: when the lock session stops answering (a
// partition between worker and server), EnsureHeld does not hang with it: the
// unanswered question is a lost lease within the check's bound.
func TestAdvisoryStalledSession(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), modes[0].mode)
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := newStore(t, d, pgfeed.Options{AdvisoryLock: pool})
	id := feed.SinkID{Feed: "stall", Sink: "s"}
	l, err := s.AcquireLease(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureHeld(t.Context()); err != nil {
		t.Fatalf("EnsureHeld before the stall: %v", err)
	}
	proxy.stall()
	start := time.Now()
	err = l.EnsureHeld(t.Context())
	took := time.Since(start)
	if !errors.Is(err, feed.ErrLeaseLost) {
		t.Fatalf("EnsureHeld on a stalled session = %v; want ErrLeaseLost", err)
	}
	if took > 8*time.Second {
		t.Errorf("EnsureHeld took %v to give up on a stalled session", took)
	}
	if err := l.EnsureHeld(t.Context()); !errors.Is(err, feed.ErrLeaseLost) {
		t.Fatalf("EnsureHeld after a lost answer = %v; a lost lease stays lost", err)
	}
	// Release cannot reach the session; it must still return.
	done := make(chan struct{})
	go func() { _ = l.Release(t.Context()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Release hangs on a stalled session")
	}
}
