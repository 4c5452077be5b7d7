package bleve_test

import (
	"testing"

	"github.com/kairos-es/kairos/feed/feedtest"
)

func TestSink(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, harness)
}
