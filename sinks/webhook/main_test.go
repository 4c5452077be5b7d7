package webhook_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a delivery, a server or a worker goroutine
// outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
