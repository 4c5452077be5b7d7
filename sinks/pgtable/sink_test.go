package pgtable_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// harness fills feedtest.SinkHarness on the test database: the renames in
// one transaction publish atomically, the feed's own rule is the only limit
// on a document, a fault dials a closed port and ends the sink pool's
// backends, and a reopened sink is a new one over the same table.
func harness(t *testing.T) (feedtest.SinkHarness, *target) {
	h, tg := harnessOn(t, newTarget(t))
	h.Fault = func(t *testing.T) func() { return tg.fault(t) }
	return h, tg
}

func harnessOn(t *testing.T, tg *target) (feedtest.SinkHarness, *target) {
	s := tg.sink(t, harnessOptions)
	tg.exec(t, `ALTER TABLE `+s.Table()+` ADD CONSTRAINT not_rejected CHECK (key <> '`+rejectedKey+`')`)
	return feedtest.SinkHarness{
		Sink:             s,
		Contents:         func(ctx context.Context) (map[feed.Key]json.RawMessage, error) { return tg.contents(ctx, "docs") },
		ConditionalOnSeq: true,
		RejectKey:        rejectedKey,
		AtomicPublish:    true,
		MaxDocumentBytes: pgtable.MaxDocumentBytes,
		Reopen:           func(t *testing.T) feed.Sink { return tg.sink(t, harnessOptions) },
	}, tg
}

func TestSink(t *testing.T) {
	t.Parallel()
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		h, _ := harness(t)
		return h
	})
}

// TestSinkPgBouncer runs the suite through PgBouncer in transaction mode, with
// the simple protocol: the sink names its schema in every statement and
// keeps no session state, and a publish is one transaction. It has no Fault:
// the bouncer's server sessions do not carry the sink's application name.
func TestSinkPgBouncer(t *testing.T) {
	t.Parallel()
	url := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:6543/postgres"
	}
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		h, _ := harnessOn(t, newTargetAt(t, url, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}))
		return h
	})
}
