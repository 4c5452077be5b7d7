package kafka

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a client, a kfake cluster or a produce
// goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
