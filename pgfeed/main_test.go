package pgfeed_test

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The model test's state machine needs runs long enough for sinks,
	// cursors and tombstones to meet: 100 steps per check unless the caller
	// chose (-rapid.steps or RAPID_STEPS).
	flag.Parse()
	chosen := os.Getenv("RAPID_STEPS") != ""
	flag.Visit(func(f *flag.Flag) { chosen = chosen || f.Name == "rapid.steps" })
	if !chosen {
		_ = flag.Set("rapid.steps", "100")
	}
	goleak.VerifyTestMain(m)
}
