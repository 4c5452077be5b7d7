package faults_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain is I6's goroutine half: the package fails if a worker, a
// heartbeat, a listener or a sink's background goroutine outlives the tests
// that started it. bleve's analysis workers are the one exception: a pool of
// the library's own, started when the package loads. It also removes the
// kairos binary the daemon tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker")); err != nil {
			fmt.Fprintf(os.Stderr, "I6: goroutines left after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
