package nats

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a connection's goroutines, a reader's
// consumer loop or a driver's worker outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
