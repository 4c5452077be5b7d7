package redis_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// quiet drops go-redis's log lines (a refused dial under a fault, say),
// which the tests provoke on purpose.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// TestMain fails the package if a collector, a worker or a pool goroutine
// outlives the tests.
func TestMain(m *testing.M) {
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}
