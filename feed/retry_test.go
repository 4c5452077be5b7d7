package feed_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

type delay time.Duration

func (d delay) Error() string             { return "come back later" }
func (d delay) RetryDelay() time.Duration { return time.Duration(d) }

func TestRetryDelay(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want time.Duration
	}{
		{"nil", nil, 0},
		{"an error that does not say", errors.New("down"), 0},
		{"one that says", delay(time.Second), time.Second},
		{"wrapped", fmt.Errorf("apply: %w", delay(2*time.Second)), 2 * time.Second},
		{"the longest in a chain", fmt.Errorf("a: %w", fmt.Errorf("b: %w", delay(3*time.Second))), 3 * time.Second},
		{"the longest of joined errors", errors.Join(delay(time.Second), fmt.Errorf("x: %w", delay(5*time.Second)), errors.New("y")), 5 * time.Second},
		{"through a typed error", feed.WriteFailed("w", delay(4*time.Second)), 4 * time.Second},
	} {
		if got := feed.RetryDelay(c.err); got != c.want {
			t.Errorf("%s: RetryDelay = %v, want %v", c.name, got, c.want)
		}
	}
}
