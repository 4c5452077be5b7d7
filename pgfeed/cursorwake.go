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

// waiters are subscriptions of one kind by feed, signalled by the
// listener: the cursor moves' (listener.cursors) and the mode switches'
// (listener.modes). The listener's mu guards them.
type waiters struct {
	subs map[feed.FeedName]map[*waiterSub]struct{}
}

// signal wakes the subscriptions of f.
func (w *waiters) signal(f feed.FeedName) {
	for sub := range w.subs[f] {
		sub.signal()
	}
}

// signalAll wakes every subscription, when the session comes (back) up.
func (w *waiters) signalAll() {
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
	return l.subscribeTo(ctx, "subscribing to the cursors of feed "+string(f), &l.cursors, f)
}

// subscribeTo registers a subscription of f in set, under register's rules.
func (l *listener) subscribeTo(ctx context.Context, op string, set *waiters, f feed.FeedName) (feed.Subscription, error) {
	sub := &waiterSub{c: make(chan struct{}, 1), l: l, set: set, f: f}
	err := l.register(ctx, op, func() {
		if set.subs == nil {
			set.subs = make(map[feed.FeedName]map[*waiterSub]struct{})
		}
		if set.subs[f] == nil {
			set.subs[f] = make(map[*waiterSub]struct{})
		}
		set.subs[f][sub] = struct{}{}
	})
	if err != nil {
		return nil, err
	}
	return sub, nil
}

type waiterSub struct {
	c    chan struct{}
	l    *listener
	set  *waiters
	f    feed.FeedName
	once sync.Once
}

func (sub *waiterSub) C() <-chan struct{} { return sub.c }

func (sub *waiterSub) signal() {
	select {
	case sub.c <- struct{}{}:
	default: // one signal already waits: wake-ups coalesce
	}
}

func (sub *waiterSub) Close() {
	sub.once.Do(func() {
		sub.l.mu.Lock()
		defer sub.l.mu.Unlock()
		delete(sub.set.subs[sub.f], sub)
		if len(sub.set.subs[sub.f]) == 0 {
			delete(sub.set.subs, sub.f)
		}
	})
}
