package feedtest

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// ManualClock is a feed.Clock that moves only when a test moves it, so lease
// expiry, renewals and EnsureHeld's age check are driven step by step instead
// of by sleeping. It is safe for concurrent use.
//
// Two ways to move it model two situations. Advance is time passing for a
// healthy process: every timer that falls due fires, so heartbeats run. Skip is
// time passing while every process on this clock is frozen (a GC pause, a
// stopped VM, a crashed holder): no timer fires, so no lease is renewed. A
// timer that fell due during a Skip fires at the next Advance, as a paused
// process's timer fires when it resumes.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer // armed: neither fired nor stopped
	changed chan struct{}  // closed and replaced whenever timers changes
}

var _ feed.Clock = (*ManualClock)(nil)

// NewManualClock returns a clock that reads start until it is moved.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires once the clock has been advanced d past
// now. Like time.NewTimer, a timer with d ≤ 0 fires at once. Its channel has a
// buffer of one, so firing never blocks the test that moves the clock.
func (c *ManualClock) NewTimer(d time.Duration) feed.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{clock: c, when: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	c.notifyLocked()
	return t
}

// Advance moves the clock d forward and fires, in the order they fall due,
// every timer due at the new time, including those that fell due during an
// earlier Skip. A negative d panics: time does not go back.
func (c *ManualClock) Advance(d time.Duration) {
	c.move("Advance", d, true)
}

// Skip moves the clock d forward without firing any timer: as if every process
// on this clock were paused for d. Timers that fell due fire at the next
// Advance (Advance(0) fires them without moving time). A negative d panics.
func (c *ManualClock) Skip(d time.Duration) {
	c.move("Skip", d, false)
}

func (c *ManualClock) move(op string, d time.Duration, fire bool) {
	if d < 0 {
		panic(fmt.Sprintf("feedtest: ManualClock.%s(%v): time does not go back", op, d))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	if !fire {
		return
	}
	var due, left []*manualTimer
	for _, t := range c.timers {
		if t.when.After(c.now) {
			left = append(left, t)
		} else {
			due = append(due, t)
		}
	}
	if len(due) == 0 {
		return
	}
	sort.SliceStable(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	c.timers = left
	for _, t := range due {
		t.ch <- c.now // buffer of one, and each timer fires once: never blocks
	}
	c.notifyLocked()
}

// Timers returns how many timers are armed: neither fired nor stopped.
func (c *ManualClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitForTimers blocks until at least n timers are armed, or ctx ends. A test
// calls it to know that a goroutine on this clock (a lease's heartbeat) has
// finished its step and armed its next timer, before moving the clock again.
func (c *ManualClock) WaitForTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		armed, changed := len(c.timers), c.changed
		c.mu.Unlock()
		if armed >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("feedtest: waiting for %d armed timers, %d armed: %w", n, armed, ctx.Err())
		}
	}
}

func (c *ManualClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

type manualTimer struct {
	clock *ManualClock
	when  time.Time
	ch    chan time.Time
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

// Stop disarms the timer; it reports whether it was still armed.
func (t *manualTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, armed := range c.timers {
		if armed == t {
			c.timers = append(c.timers[:i:i], c.timers[i+1:]...)
			c.notifyLocked()
			return true
		}
	}
	return false
}
