package kafka

import (
	"testing"

	"github.com/kairos-es/kairos/feed/feedtest"
)

func TestSink(t *testing.T) {
	feedtest.RunSink(t, newHarness)
}
