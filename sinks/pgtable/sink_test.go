package pgtable_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// rejectedKey is refused by a CHECK constraint of the table's own (copied to
// every shadow by LIKE … INCLUDING ALL): a real cause, found by the row-by-row
// fallback, whatever the document.
const rejectedKey = "rejected: ✗"

// harnessOptions map an integer column, which RunSink's documents either
// lack or whose values it does not care about, so that every write goes
// through the mapped path.
var harnessOptions = pgtable.Options{
	Table:   "docs",
	Create:  true,
	Columns: []pgtable.Column{{Name: "n", Path: "$.n", Type: pgtable.TypeInteger}, {Name: "v", Type: pgtable.TypeJSONB}},
}

// harness fills feedtest.SinkHarness. When the extended suite lands, add:
//
//	AtomicPublish:    true,
//	MaxDocumentBytes: pgtable.MaxDocumentBytes,
//	Fault:            tg.fault,
//	Reopen:           func(t *testing.T) feed.Sink { return tg.sink(t, harnessOptions) },
func harness(t *testing.T) (feedtest.SinkHarness, *target) {
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	tg.exec(t, `ALTER TABLE `+s.Table()+` ADD CONSTRAINT not_rejected CHECK (key <> '`+rejectedKey+`')`)
	return feedtest.SinkHarness{
		Sink:             s,
		Contents:         func(ctx context.Context) (map[feed.Key]json.RawMessage, error) { return tg.contents(ctx, "docs") },
		ConditionalOnSeq: true,
		RejectKey:        rejectedKey,
	}, tg
}

func TestSink(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		h, _ := harness(t)
		return h
	})
}
