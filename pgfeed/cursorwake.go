package pgfeed

import (
	"context"
	"sync"

	"github.com/kairos-es/kairos/feed"
)

// Cursor wake-ups: every cursor move that lands notifies the store's cursor
// channel in its own statement (statements.cas), so the notification is sent
// at the move's commit, and only then. The store's one LISTEN session (the
// listener) listens on that channel beside the feed channel and relays each
// notification to the feed's cursor subscriptions, exactly as it relays
// commits, reconnects included: after a reconnect every subscription is
// signalled once, which covers a move made while the session was down. A
// waiter in a process that runs no worker is woken as promptly as one beside
// the worker, since the wake-up travels through the database.
//
// The cost lands on the mover: a notifying transaction takes PostgreSQL's
// notify queue lock at commit, which serialises it with every other notifying
// commit of the cluster. A catching-up worker moves its cursor a few times a
// second (syncer's MoveInterval), so this is one more notification per move;
// BENCHMARKS.md has what it costs a catch-up.

var _ feed.CursorWatcher = (*Store)(nil)

// cursorWaiters are the listener's cursor-move subscriptions, by feed. The
// listener's mu guards it.
type cursorWaiters struct {
	subs map[feed.FeedName]map[*cursorSub]struct{}
}

// signal wakes the cursor subscriptions of f.
func (w *cursorWaiters) signal(f feed.FeedName) {
	for sub := range w.subs[f] {
		sub.signal()
	}
}

// signalAll wakes every cursor subscription, when the session comes (back) up.
func (w *cursorWaiters) signalAll() {
	for _, subs := range w.subs {
		for sub := range subs {
			sub.signal()
		}
	}
}

// SubscribeCursors returns a subscription signalled after every cursor move
// of a sink of f that lands, from any process on this database and this
// schema and prefix; see feed.CursorWatcher. It shares Subscribe's listener
// and its rules: it fails at once while the listener is down, and the waiter
// then polls. Behind a transaction pooler no notification arrives (the
// listener warns); waiters then only poll.
func (s *Store) SubscribeCursors(ctx context.Context, f feed.FeedName) (feed.Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	l, err := s.startListener()
	if err != nil {
		return nil, err
	}
	sub := &cursorSub{c: make(chan struct{}, 1), l: l, f: f}
	err = l.register(ctx, "subscribing to the cursors of feed "+string(f), func() {
		if l.cursors.subs == nil {
			l.cursors.subs = make(map[feed.FeedName]map[*cursorSub]struct{})
		}
		if l.cursors.subs[f] == nil {
			l.cursors.subs[f] = make(map[*cursorSub]struct{})
		}
		l.cursors.subs[f][sub] = struct{}{}
	})
	if err != nil {
		return nil, err
	}
	return sub, nil
}

type cursorSub struct {
	c    chan struct{}
	l    *listener
	f    feed.FeedName
	once sync.Once
}

func (sub *cursorSub) C() <-chan struct{} { return sub.c }

func (sub *cursorSub) signal() {
	select {
	case sub.c <- struct{}{}:
	default: // one signal already waits: wake-ups coalesce
	}
}

func (sub *cursorSub) Close() {
	sub.once.Do(func() {
		sub.l.mu.Lock()
		defer sub.l.mu.Unlock()
		delete(sub.l.cursors.subs[sub.f], sub)
		if len(sub.l.cursors.subs[sub.f]) == 0 {
			delete(sub.l.cursors.subs, sub.f)
		}
	})
}
