package feedtest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kairos-es/kairos/feed/feedtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fired reports whether ch holds a value now, and that value.
func fired(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestManualClockNowMovesOnlyWhenMoved(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	if got := c.Now(); !got.Equal(epoch) {
		t.Fatalf("Now() = %v, want %v", got, epoch)
	}
	c.Advance(1500 * time.Millisecond)
	c.Skip(2 * time.Second)
	if got, want := c.Now(), epoch.Add(3500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now() after Advance and Skip = %v, want %v", got, want)
	}
}

func TestManualClockAdvanceFiresDueTimersOnly(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	early, late := c.NewTimer(time.Second), c.NewTimer(3*time.Second)
	if n := c.Timers(); n != 2 {
		t.Fatalf("Timers() = %d, want 2", n)
	}
	c.Advance(999 * time.Millisecond)
	if _, ok := fired(early.C()); ok {
		t.Fatal("a 1s timer fired after 999ms")
	}
	c.Advance(time.Millisecond)
	if v, ok := fired(early.C()); !ok || !v.Equal(epoch.Add(time.Second)) {
		t.Fatalf("1s timer after 1s: fired=%v value=%v, want fired at %v", ok, v, epoch.Add(time.Second))
	}
	if _, ok := fired(late.C()); ok {
		t.Fatal("a 3s timer fired after 1s")
	}
	if n := c.Timers(); n != 1 {
		t.Fatalf("Timers() after one fired = %d, want 1", n)
	}
	c.Advance(5 * time.Second)
	if _, ok := fired(late.C()); !ok {
		t.Fatal("a 3s timer did not fire after 6s")
	}
	if late.Stop() {
		t.Fatal("Stop() of a fired timer reported true")
	}
	if n := c.Timers(); n != 0 {
		t.Fatalf("Timers() after all fired = %d, want 0", n)
	}
}

func TestManualClockSkipDoesNotFire(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	tm := c.NewTimer(time.Second)
	c.Skip(10 * time.Second)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("Skip fired a timer")
	}
	if n := c.Timers(); n != 1 {
		t.Fatalf("Timers() after Skip = %d, want 1 (still armed)", n)
	}
	c.Advance(0)
	if v, ok := fired(tm.C()); !ok || !v.Equal(epoch.Add(10*time.Second)) {
		t.Fatalf("timer due during Skip, after Advance(0): fired=%v value=%v, want the resume time %v", ok, v, epoch.Add(10*time.Second))
	}
}

func TestManualClockStop(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	tm := c.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop() of an armed timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop() reported true")
	}
	c.Advance(time.Hour)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if n := c.Timers(); n != 0 {
		t.Fatalf("Timers() = %d, want 0", n)
	}
}

func TestManualClockNonPositiveTimerFiresAtOnce(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	for _, d := range []time.Duration{0, -time.Second} {
		tm := c.NewTimer(d)
		if _, ok := fired(tm.C()); !ok {
			t.Errorf("NewTimer(%v) did not fire at once", d)
		}
	}
	if n := c.Timers(); n != 0 {
		t.Fatalf("Timers() = %d, want 0", n)
	}
}

func TestManualClockNegativeMovePanics(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	for name, move := range map[string]func(time.Duration){"Advance": c.Advance, "Skip": c.Skip} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(-1ns) did not panic", name)
				}
			}()
			move(-1)
		}()
	}
	if got := c.Now(); !got.Equal(epoch) {
		t.Fatalf("Now() = %v after refused moves, want %v", got, epoch)
	}
}

func TestManualClockWaitForTimers(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A goroutine that ticks three times on the clock, as a heartbeat does.
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 {
			tm := c.NewTimer(time.Second)
			ticks <- <-tm.C()
		}
	}()
	for i := 1; i <= 3; i++ {
		if err := c.WaitForTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Second)
		if got, want := <-ticks, epoch.Add(time.Duration(i)*time.Second); !got.Equal(want) {
			t.Fatalf("tick %d at %v, want %v", i, got, want)
		}
	}
	<-done

	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := c.WaitForTimers(short, 1); err == nil {
		t.Fatal("WaitForTimers(1) with no timer armed returned nil; want the context's error")
	}
}

func TestManualClockConcurrentUse(t *testing.T) {
	t.Parallel()
	c := feedtest.NewManualClock(epoch)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				tm := c.NewTimer(time.Millisecond)
				_ = c.Now()
				_ = c.Timers()
				c.Advance(time.Millisecond)
				if _, ok := fired(tm.C()); !ok {
					t.Error("a timer due before the Advance that followed it did not fire")
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), epoch.Add(400*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now() = %v, want %v", got, want)
	}
}
