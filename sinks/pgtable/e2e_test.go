package pgtable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// recorded wraps the sink so that every table that serves or will serve
// readers carries the test's recording trigger (LIKE does not copy triggers),
// and remembers which tables were published.
type recorded struct {
	*pgtable.Sink
	tg *target
	t  *testing.T

	mu        sync.Mutex
	published []uint32 // oids of the tables that served readers, in order
}

func (r *recorded) attach(table string) {
	r.tg.exec(r.t, `CREATE TRIGGER record AFTER INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION "`+r.tg.schema+`".record()`)
}

func (r *recorded) markLive() {
	var oid uint32
	if err := r.tg.read.QueryRow(context.Background(), `SELECT $1::regclass::oid`, r.Table()).Scan(&oid); err != nil {
		r.t.Errorf("reading the live table's oid: %v", err)
	}
	r.mu.Lock()
	r.published = append(r.published, oid)
	r.mu.Unlock()
}

func (r *recorded) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	rt, err := r.Sink.OpenResync(ctx, g)
	if err != nil {
		return nil, err
	}
	r.attach(rt.(*pgtable.Resync).Table())
	return &recordedResync{ResyncTarget: rt, r: r}, nil
}

type recordedResync struct {
	feed.ResyncTarget
	r *recorded
}

func (rr *recordedResync) Publish(ctx context.Context) error {
	if err := rr.ResyncTarget.Publish(ctx); err != nil {
		return err
	}
	rr.r.markLive()
	return nil
}

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into this sink, the feed and the
// target on pools of their own, with an outage of the target after the
// rebuild. The table ends with exactly the feed's live documents, and the
// trigger's log shows no key of a served table ever going back to an older
// seq.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// The target, with its recording trigger.
	tg := newTarget(t)
	tg.exec(t, `CREATE TABLE "`+tg.schema+`".log (id bigserial PRIMARY KEY, rel oid NOT NULL, key text NOT NULL, seq bigint NOT NULL)`)
	tg.exec(t, `CREATE FUNCTION "`+tg.schema+`".record() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO "`+tg.schema+`".log (rel, key, seq) VALUES (TG_RELID, NEW.key, NEW.seq); RETURN NULL; END $$`)
	sink := &recorded{Sink: tg.sink(t, pgtable.Options{Table: "orders", Create: true, Columns: []pgtable.Column{{Name: "n", Type: pgtable.TypeBigint}}}), tg: tg, t: t}
	sink.attach(sink.Table())
	sink.markLive()

	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{Sink: "table", Seed: 11, Fault: func() func() { return tg.fault(t) }})
	got, err := tg.contents(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.CheckDocs(t, "the table", got, m.Live)
	var mapped int
	if err := tg.read.QueryRow(ctx, `SELECT count(*) FROM `+sink.Table()+` WHERE doc IS NOT NULL AND n = (doc->>'n')::bigint`).Scan(&mapped); err != nil || mapped != len(m.Live) {
		t.Errorf("rows whose mapped column matches the document: %d of %d (%v)", mapped, len(m.Live), err)
	}

	// The log: every write to a table that served readers, in order.
	sink.mu.Lock()
	published := append([]uint32(nil), sink.published...)
	sink.mu.Unlock()
	if len(published) < 3 {
		t.Errorf("tables published: %d, want the first, the initial resync's and the rebuild's", len(published))
	}
	rows, err := tg.read.Query(ctx, `SELECT key, seq FROM "`+tg.schema+`".log WHERE rel = ANY($1) ORDER BY id`, published)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	writes, back := 0, 0
	for rows.Next() {
		var k string
		var s int64
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		writes++
		if s <= last[k] {
			back++
			if back < 5 {
				t.Errorf("key %s went from seq %d to %d", k, last[k], s)
			}
		}
		last[k] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if back > 0 {
		t.Errorf("%d writes of %d took a key back to an older seq", back, writes)
	}
	t.Logf("%d changes, %d writes to served tables, %d tables published", m.Written, writes, len(published))
}
