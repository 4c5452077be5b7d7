package pgtable_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a worker, a reader loop or a pool goroutine
// outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
