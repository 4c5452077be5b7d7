package pgfeed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

// listener is the store's one LISTEN session, shared by every subscription.
//
// # Why no wake-up is lost
//
// Subscribe registers a subscription only while the session is up, under the
// same lock the session's state changes under, so every commit after Subscribe
// returns either is notified on that session or happens after the session
// dropped; and every time the session comes (back) up, LISTEN runs first and
// then every subscription is signalled once, so a commit missed while it was
// down is caught up by the worker's next read. Duplicate and spurious wake-ups
// are allowed by the contract; lost ones are not.
//
// # Why a listener that is down never holds a worker up
//
// Wake-ups only shorten a worker's wait, which also polls. So the session's
// setup (connect, LISTEN, the pooler check) is bounded by
// Options.ListenTimeout, and while the session is down Subscribe fails at once
// with the reason, instead of waiting for a reconnect that may never come: the
// worker polls meanwhile and tries again. Subscribe waits only for an attempt
// under way that has not failed yet, bounded by its ctx.
type listener struct {
	s       *Store
	timeout time.Duration
	check   time.Duration
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	subs    map[feed.FeedName]map[*subscription]struct{}
	up      bool          // a session listens now
	down    error         // why the last attempt or session ended; nil while up or before the first attempt ends
	changed chan struct{} // closed, and replaced, whenever up or down changes
	// cursors are the cursor-move subscriptions (cursorwake.go) and modes
	// the mode-switch ones (modewake.go), guarded by mu.
	cursors, modes waiters

	warned bool // the pooler warning was logged; only run's goroutine uses it
}

const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 5 * time.Second
)

func (s *Store) startListener() (*listener, error) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	if s.listener != nil {
		return s.listener, nil
	}
	if s.closed {
		return nil, feed.Unreadable("subscribing", errors.New("the store is closed"))
	}
	if s.listen == nil {
		return nil, feed.Invalid("options.listen", "is needed to subscribe when db is neither a *pgxpool.Pool nor a *pgx.Conn")
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		s:       s,
		timeout: s.listenTimeout,
		check:   s.listenCheck,
		cancel:  cancel,
		done:    make(chan struct{}),
		subs:    make(map[feed.FeedName]map[*subscription]struct{}),
		changed: make(chan struct{}),
	}
	s.listener = l
	go l.run(ctx)
	return l, nil
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

// setState records a change of the session's state and wakes every Subscribe
// waiting for one. Called with l.mu held.
func (l *listener) setState(up bool, down error) {
	l.up, l.down = up, down
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	wait := reconnectMin
	for {
		listened, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil { // cannot happen: a session ends on an error
			err = errors.New("the session ended")
		}
		l.mu.Lock()
		l.setState(false, err)
		l.mu.Unlock()
		if listened {
			wait = reconnectMin // it was up: start the backoff afresh
		}
		l.s.logger.Warn("feed listener is down; workers poll until it reconnects", "schema", l.s.names.schema, "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		wait = min(wait*2, reconnectMax)
	}
}

// session runs one connection: connect and LISTEN within the listen timeout,
// signal everyone, then relay notifications until the connection fails or
// ctx ends. listened says whether it got as far as listening.
func (l *listener) session(ctx context.Context) (listened bool, err error) {
	sctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	setup := func(err error) error {
		if ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("no LISTEN session within options.listen_timeout (%v): %w", l.timeout, err)
		}
		return err
	}
	conn, err := l.s.listen(sctx)
	if err != nil {
		return false, setup(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(sctx, "LISTEN "+pgschema.Quote(l.s.names.channel)+"; LISTEN "+pgschema.Quote(l.s.names.cursorChannel)+"; LISTEN "+pgschema.Quote(l.s.names.modeChannel), pgx.QueryExecModeSimpleProtocol); err != nil {
		return false, setup(err)
	}
	// Behind a transaction pooler the LISTEN went to a server session the
	// pooler has already handed on, and no notification will come back.
	// Workers still poll, so this is a warning, not an error.
	var backend uint32
	if err := conn.QueryRow(sctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return false, setup(err)
	}
	if backend != conn.PgConn().PID() && !l.warned {
		l.warned = true
		l.s.logger.Warn("the feed listener's connection goes through a transaction pooler, which does not deliver notifications; workers will fall back to polling. Set pgfeed.Options.Listen (kairos run: database.listen_url) to a direct connection", "schema", l.s.names.schema)
	}
	l.mu.Lock()
	l.setState(true, nil)
	for _, subs := range l.subs {
		for sub := range subs {
			sub.signal()
		}
	}
	l.cursors.signalAll()
	l.modes.signalAll()
	l.mu.Unlock()
	for {
		n, err := l.next(ctx, conn)
		if err != nil {
			return true, err
		}
		l.mu.Lock()
		switch n.Channel {
		case l.s.names.cursorChannel:
			l.cursors.signal(feed.FeedName(n.Payload))
		case l.s.names.modeChannel:
			l.modes.signal(feed.FeedName(n.Payload))
		default:
			for sub := range l.subs[feed.FeedName(n.Payload)] {
				sub.signal()
			}
		}
		l.mu.Unlock()
	}
}

// next waits for the session's next notification. After Options.ListenCheck
// of silence it checks the session with a round trip bounded by
// Options.ListenTimeout, and fails if that gets no answer: a session only
// waiting sends nothing, so a network that drops its packets silently shows
// up nowhere else. A wait cut short by its deadline leaves the connection
// usable (pgconn closes it only on errors other than timeouts).
func (l *listener) next(ctx context.Context, conn *pgx.Conn) (*pgconn.Notification, error) {
	for {
		wctx, cancel := context.WithTimeout(ctx, l.check)
		n, err := conn.WaitForNotification(wctx)
		silent := err != nil && ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) && !conn.IsClosed()
		cancel()
		if !silent {
			return n, err
		}
		pctx, cancel := context.WithTimeout(ctx, l.timeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the session was silent for options.listen_check (%v) and did not answer a check within options.listen_timeout (%v): %w", l.check, l.timeout, err)
		}
	}
}

// Subscribe returns a subscription signalled after commits to f; see
// feed.Reader. The first Subscribe of a store starts its listener. While the
// listener's session is up, Subscribe returns at once; while it is down (its
// last attempt failed, or the session dropped and has not reconnected yet),
// it fails at once with an *feed.UnreadableError that says why, and the
// caller polls and tries again later; only while the first attempt is under
// way does it wait for it, bounded by ctx and Options.ListenTimeout.
func (s *Store) Subscribe(ctx context.Context, f feed.FeedName) (feed.Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	l, err := s.startListener()
	if err != nil {
		return nil, err
	}
	sub := &subscription{c: make(chan struct{}, 1), l: l, f: f}
	err = l.register(ctx, "subscribing to feed "+string(f), func() {
		if l.subs[f] == nil {
			l.subs[f] = make(map[*subscription]struct{})
		}
		l.subs[f][sub] = struct{}{}
	})
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// register runs add, under the listener's lock, once the session is up: at
// once when it is, after the attempt under way when one is (bounded by ctx),
// and never while the session is down, which fails at once with the reason
// (see the listener's doc). Every subscription, to commits or to cursor
// moves, is registered through it.
func (l *listener) register(ctx context.Context, op string, add func()) error {
	for {
		l.mu.Lock()
		if l.up {
			add()
			l.mu.Unlock()
			return nil
		}
		down, changed := l.down, l.changed
		l.mu.Unlock()
		if down != nil {
			return feed.Unreadable(op, fmt.Errorf("the feed listener is down: %w", down))
		}
		select {
		case <-changed:
		case <-l.done:
			return feed.Unreadable(op, errors.New("the store is closed"))
		case <-ctx.Done():
			return feed.Unreadable(op, fmt.Errorf("the feed listener is not up yet: %w", ctx.Err()))
		}
	}
}

type subscription struct {
	c    chan struct{}
	l    *listener
	f    feed.FeedName
	once sync.Once
}

func (sub *subscription) C() <-chan struct{} { return sub.c }

func (sub *subscription) signal() {
	select {
	case sub.c <- struct{}{}:
	default: // one signal already waits: wake-ups coalesce
	}
}

func (sub *subscription) Close() {
	sub.once.Do(func() {
		sub.l.mu.Lock()
		defer sub.l.mu.Unlock()
		delete(sub.l.subs[sub.f], sub)
		if len(sub.l.subs[sub.f]) == 0 {
			delete(sub.l.subs, sub.f)
		}
	})
}
