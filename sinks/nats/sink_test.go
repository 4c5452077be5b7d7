package nats

import (
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

// harness is one RunSink subtest's sink: its own buckets, its connection
// behind a fault link, a reader on a connection of its own.
func harness(t *testing.T, opts Options) feedtest.SinkHarness {
	opts.Bucket = bucketName(t)
	link := newLink(t)
	nc := connect(t, link)
	s := openSink(t, nc, opts)
	r := newReader(t, connect(t, nil), opts.Bucket)
	return feedtest.SinkHarness{
		Sink:             s,
		Contents:         r.Documents,
		ConditionalOnSeq: true,
		AtomicPublish:    true,
		MaxDocumentBytes: s.MaxDocumentBytes(),
		Fault:            func(t *testing.T) func() { return link.Down(t, nc) },
		Reopen:           func(t *testing.T) feed.Sink { return openSink(t, connect(t, nil), opts) },
	}
}

func TestSinkSuite(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness { return harness(t, Options{}) })
}

// TestSinkSuiteNoHints runs the suite with the sink remembering nothing of
// its own writes, so every write of an existing key takes the server's
// conditional publish, its refusal, a re-read and a second publish: the
// seq guard is the server's alone.
func TestSinkSuiteNoHints(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness { return harness(t, Options{HintKeys: -1}) })
}
