package pgfeed_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestSubscribeWhileListenerDown: a Listen that blocks until its ctx ends
// costs the first Subscribe one ListenTimeout, not its caller's whole ctx;
// while the listener stays down every later Subscribe fails at once with the
// reason; and once Listen works again, Subscribe succeeds and commits wake it.
func TestSubscribeWhileListenerDown(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	var up atomic.Bool
	const timeout = time.Second
	s := newStore(t, d, pgfeed.Options{ListenTimeout: timeout, Listen: func(ctx context.Context) (*pgx.Conn, error) {
		if up.Load() {
			return pgx.Connect(ctx, pgtest.URL())
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	subscribe := func(what string, within time.Duration) (feed.Subscription, error) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 10*timeout)
		defer cancel()
		began := time.Now()
		sub, err := s.Subscribe(sctx, "f")
		if took := time.Since(began); took > within {
			t.Fatalf("%s: Subscribe took %v (%v); want at most %v", what, took, err, within)
		}
		return sub, err
	}
	if _, err := subscribe("the first attempt hangs", 5*timeout); !errors.Is(err, feed.ErrUnreadable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the first Subscribe = %v; want an UnreadableError naming the attempt's deadline", err)
	}
	for i := range 3 {
		if _, err := subscribe("the listener known down", timeout/2); !errors.Is(err, feed.ErrUnreadable) {
			t.Fatalf("Subscribe %d while the listener is down = %v; want an UnreadableError", i, err)
		}
	}
	up.Store(true)
	var sub feed.Subscription
	for deadline := time.Now().Add(30 * time.Second); sub == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no Subscribe succeeded within 30s of the listener coming back")
		}
		sub, _ = subscribe("the listener coming back", 5*timeout)
		time.Sleep(20 * time.Millisecond) // the listener's reconnect backoff
	}
	defer sub.Close()
	select { // the listener's coming up signals every subscription; drain it
	case <-sub.C():
	default:
	}
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of a commit once the listener is back")
	}
}

// TestListenFirstThenSignal: when the listener's session comes back, it
// LISTENs first and only then signals every subscription, so a worker that
// reads on that signal and then waits is woken by any commit after its
// read. The session runs over a slow link here (every client message reaches
// the server 300ms late), so a listener that signalled before its LISTEN was
// in place would let the commit made right after the signal go unnotified.
func TestListenFirstThenSignal(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	app := "kairos-slowlisten-" + d.schema
	s := newStore(t, d, pgfeed.Options{Listen: func(ctx context.Context) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(u.String())
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = app
		return pgx.ConnectConfig(ctx, cfg)
	}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sub, err := s.Subscribe(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	proxy.setDelay(300 * time.Millisecond)
	terminate(t, d.pool, app)
	select { // the session is back
	case <-sub.C():
	case <-time.After(20 * time.Second):
		t.Fatal("no signal within 20s of the listener's session being terminated")
	}
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(5 * time.Second):
		t.Fatal("a commit right after the listener's reconnect signal woke nobody within 5s")
	}
}

// TestRebuildWakes: a rebuild is a change of the feed like a write, and its
// commit wakes the feed's subscribers, so an idle worker starts its resync at
// once rather than on its next poll.
func TestRebuildWakes(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	sub, err := s.Subscribe(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select {
	case <-sub.C():
	default:
	}
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { _, err := s.ResetTx(ctx, tx, "f"); return err }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of a rebuild's commit")
	}
}

// TestListenCheckFindsSilentPartition: a listener's session that only waits
// sends nothing, so a network that drops its packets silently would leave it
// trusted for as long as TCP takes to give up. After Options.ListenCheck of
// silence the listener checks the session, and a check that gets no answer
// within Options.ListenTimeout takes the listener down, which Subscribe then
// reports at once, so workers know to poll.
func TestListenCheckFindsSilentPartition(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	s := newStore(t, d, pgfeed.Options{ListenCheck: 200 * time.Millisecond, ListenTimeout: time.Second, Listen: func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.Connect(ctx, u.String())
	}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sub, err := s.Subscribe(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Checks that get their answer keep the session: it still delivers.
	time.Sleep(time.Second)
	select {
	case <-sub.C():
	default:
	}
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of a commit after several answered checks")
	}
	proxy.stall()
	began := time.Now()
	var errs []error
	for time.Since(began) < 15*time.Second {
		other, err := s.Subscribe(ctx, "f")
		if err == nil {
			other.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		errs = append(errs, err)
		if strings.Contains(err.Error(), "options.listen_check") {
			if !errors.Is(err, feed.ErrUnreadable) {
				t.Fatalf("Subscribe after a failed check = %v; want an UnreadableError", err)
			}
			if took := time.Since(began); took > 8*time.Second {
				t.Fatalf("the silent session was found after %v; want within a check and its timeout", took)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the listener still trusted its silent session 15s after the network went dark; Subscribe errors seen: %v", errs)
}
