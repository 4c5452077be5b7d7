package syncer_test

import (
	"os"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

// TestMain fails the package if any worker, heartbeat or subscription
// goroutine outlives the tests: shutdown must stop them all.
// A rival process of TestRivalProcesses runs its runner instead.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(rivalChild())
	}
	goleak.VerifyTestMain(m)
}

func synctestRun(t *testing.T, f func(t *testing.T)) { synctest.Test(t, f) }
