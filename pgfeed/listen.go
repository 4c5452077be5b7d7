package pgfeed

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

// listener is the store's one LISTEN session, shared by every subscription.
//
// # Why no wake-up is lost
//
// A subscription is registered before Subscribe waits for the session's first
// LISTEN to be in place, so every commit after Subscribe returns either is
// notified on that session or happens while the session is down; and every
// time the session comes (back) up, LISTEN runs first and then every
// subscription is signalled once, so a commit missed while it was down is
// caught up by the worker's next read. Duplicate and spurious wake-ups are
// allowed by the contract; lost ones are not.
type listener struct {
	s      *Store
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	subs  map[feed.FeedName]map[*subscription]struct{}
	ready chan struct{} // closed once the first LISTEN is in place
	isUp  bool
	// cursors are the cursor-move subscriptions (cursorwake.go), guarded by mu.
	cursors cursorWaiters

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
		s:      s,
		cancel: cancel,
		done:   make(chan struct{}),
		subs:   make(map[feed.FeedName]map[*subscription]struct{}),
		ready:  make(chan struct{}),
	}
	s.listener = l
	go l.run(ctx)
	return l, nil
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	wait := reconnectMin
	for {
		err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		l.s.logger.Warn("feed listener lost its connection; reconnecting", "schema", l.s.names.schema, "error", err, "retry_in", wait)
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

// session runs one connection: LISTEN, signal everyone, then relay
// notifications until the connection fails or ctx ends.
func (l *listener) session(ctx context.Context) error {
	conn, err := l.s.listen(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgschema.Quote(l.s.names.channel)+"; LISTEN "+pgschema.Quote(l.s.names.cursorChannel), pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	// Behind a transaction pooler the LISTEN went to a server session the
	// pooler has already handed on, and no notification will come back.
	// Workers still poll, so this is a warning, not an error.
	var backend uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return err
	}
	if backend != conn.PgConn().PID() && !l.warned {
		l.warned = true
		l.s.logger.Warn("the feed listener's connection goes through a transaction pooler, which does not deliver notifications; workers will fall back to polling. Set pgfeed.Options.Listen to a direct connection", "schema", l.s.names.schema)
	}
	l.mu.Lock()
	if !l.isUp {
		l.isUp = true
		close(l.ready)
	}
	for _, subs := range l.subs {
		for sub := range subs {
			sub.signal()
		}
	}
	l.cursors.signalAll()
	l.mu.Unlock()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.mu.Lock()
		if n.Channel == l.s.names.cursorChannel {
			l.cursors.signal(feed.FeedName(n.Payload))
		} else {
			for sub := range l.subs[feed.FeedName(n.Payload)] {
				sub.signal()
			}
		}
		l.mu.Unlock()
	}
}

// Subscribe returns a subscription signalled after commits to f; see
// feed.Reader. The first Subscribe of a store starts its listener and waits,
// bounded by ctx, until it listens.
func (s *Store) Subscribe(ctx context.Context, f feed.FeedName) (feed.Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	l, err := s.startListener()
	if err != nil {
		return nil, err
	}
	sub := &subscription{c: make(chan struct{}, 1), l: l, f: f}
	l.mu.Lock()
	if l.subs[f] == nil {
		l.subs[f] = make(map[*subscription]struct{})
	}
	l.subs[f][sub] = struct{}{}
	l.mu.Unlock()
	select {
	case <-l.ready:
		return sub, nil
	case <-l.done:
		sub.Close()
		return nil, feed.Unreadable("subscribing to feed "+string(f), errors.New("the store is closed"))
	case <-ctx.Done():
		sub.Close()
		return nil, feed.Unreadable("subscribing to feed "+string(f), ctx.Err())
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
