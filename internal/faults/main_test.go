package faults_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain is I6's goroutine half: the package fails if a worker, a
// heartbeat, a listener or a sink's background goroutine outlives the tests
// that started it. bleve's analysis workers are the one exception: a pool of
// the library's own, started when the package loads.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}
