package pgfeed

import (
	"context"
	"errors"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Mode-switch wake-ups: SetWriteMode notifies the store's mode channel in
// its own transaction, so the notification is sent at the switch's commit
// and only then. A sealer (RunSealer) that found its feed in the locked mode
// waits on a subscription to that channel, through the store's one LISTEN
// session, and probes the mode again as soon as it is signalled: the first
// writes after a switch to the concurrent mode wait for a probe and a
// round, not for SealerOptions.ModeCheck.
//
// Why no switch is missed: the sealer subscribes before the probe whose
// answer it waits on (a fresh subscription is followed by a probe at once),
// and the listener signals every commit after a subscription, or every
// subscription after a reconnect (see the listener's doc). What is left is
// a notification that never comes: a listener down, which the sealer
// subscribes again after (modeResubscribe) and then probes; a store that
// cannot listen (db neither a pool nor a connection, and no
// Options.Listen); and a LISTEN through a transaction pooler, which the
// pooler does not deliver (the listener warns). In those cases the mode is
// read every ModeCheck, as before.

// modeResubscribe is how long a sealer waits to subscribe again after the
// listener refused it (the listener was down): about its longest reconnect
// pause, and no statement is sent while it fails.
const modeResubscribe = reconnectMax

// modeWake is one sealer's subscription to its feed's mode switches.
type modeWake struct {
	s     *Store
	f     feed.FeedName
	sub   feed.Subscription // nil until subscribed
	never bool              // the store cannot listen: ModeCheck alone
}

func (w *modeWake) close() {
	if w.sub != nil {
		w.sub.Close()
	}
}

// wait is a sealer's pause on a feed it found in the locked mode: until d
// has passed, a switch is signalled, or a first subscription lands (a
// switch before it reached no one, so the caller probes at once). It
// returns false when ctx ended.
func (w *modeWake) wait(ctx context.Context, d time.Duration) bool {
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for {
		var wake <-chan struct{}
		var retry *time.Timer
		switch {
		case w.sub != nil:
			wake = w.sub.C()
		case !w.never:
			sub, err := w.s.subscribeMode(ctx, w.f)
			if err == nil {
				w.sub = sub
				return ctx.Err() == nil
			}
			var invalid *feed.InvalidError
			if w.never = errors.As(err, &invalid); !w.never {
				retry = time.NewTimer(modeResubscribe)
			}
		}
		var again <-chan time.Time
		if retry != nil {
			again = retry.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-timeout.C:
			return true
		case <-wake:
			return true
		case <-again:
		}
	}
}

// subscribeMode returns a subscription signalled after every SetWriteMode
// of f that commits, from any process on this database and this schema and
// prefix, under Subscribe's rules.
func (s *Store) subscribeMode(ctx context.Context, f feed.FeedName) (feed.Subscription, error) {
	l, err := s.startListener()
	if err != nil {
		return nil, err
	}
	return l.subscribeTo(ctx, "subscribing to the mode of feed "+string(f), &l.modes, f)
}
