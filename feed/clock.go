package feed

import "time"

// Clock is the time a store and its leases run on. Production code uses
// SystemClock; tests inject a manual clock (feedtest.ManualClock) to drive lease
// expiry and renewals without sleeping.
//
// With SystemClock, Postgres stores stamp and compare stored times with the
// database's clock, so workers whose clocks disagree still agree on who holds a
// lease; an injected clock replaces the database's too, as River's injected
// "now" does.
type Clock interface {
	// Now is the current time. SystemClock's carries a monotonic reading, so
	// lease ages measured with it are immune to wall-clock steps.
	Now() time.Time
	// NewTimer fires once, d from now.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did so.
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (SystemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

// IsSystemClock reports whether c is nil or SystemClock: whether a store should
// use the database's clock rather than c.
func IsSystemClock(c Clock) bool {
	switch c.(type) {
	case nil, SystemClock, *SystemClock:
		return true
	}
	return false
}
