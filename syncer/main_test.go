package syncer_test

import (
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

// TestMain fails the package if any worker, heartbeat or subscription
// goroutine outlives the tests: shutdown must stop them all.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func synctestRun(t *testing.T, f func(t *testing.T)) { synctest.Test(t, f) }
