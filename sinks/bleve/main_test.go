package bleve_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if an index's goroutines (bleve's introducer,
// persister and merger), a worker or a reader outlive the tests. bleve's
// analysis workers are the one exception: a pool of the library's own,
// started when the package loads and shared by every index of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}
