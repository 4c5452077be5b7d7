package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/pgtable"
	"github.com/kairos-es/kairos/syncer"
)

// TestStaleCallSeqGuard is fault 2 with the one stale call made to land: the
// holder's link to its sink (a PostgreSQL table) turns slow, so that the
// call it has under way reaches the table seconds later, and meanwhile its
// lock session is cut off and a rival takes over and writes newer versions
// of the same keys. The stale call lands after them; the sink's seq guard
// must make it a no-op. A monitor reads the table every 10 ms and fails the
// test if any key's stored seq ever goes down (I2, on the sink itself), and
// the call log shows the stale call carried keys the rival had already
// written newer (so the guard was put to work), one stale call at most (I4),
// and the table ends with the feed's live documents (I1).
func TestStaleCallSeqGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(200)
	load := e.writeLoad(200, 5*time.Millisecond)

	lockProxy := newProxy(t, upstreamHost(t))
	sinkProxy := newProxy(t, upstreamHost(t))
	data := e.pool("", pgx.QueryExecModeCacheStatement, 4)
	storeA := e.store(data, pgfeed.Options{AdvisoryLock: e.pool(lockProxy.addr, pgx.QueryExecModeCacheStatement, 2)})
	storeB := e.store(data, pgfeed.Options{AdvisoryLock: e.pool("", pgx.QueryExecModeCacheStatement, 2)})
	table := func(addr string) feed.Sink {
		s, err := pgtable.New(e.ctx, e.pool(addr, pgx.QueryExecModeCacheStatement, 2), pgtable.Options{Schema: e.schema, Table: "mirror", Create: true})
		if err != nil {
			t.Fatalf("pgtable.New: %v", err)
		}
		return s
	}
	sinkA, sinkB := table(sinkProxy.addr), table("")
	regress := e.watchTable()

	opts := testOptions()
	opts.SinkTimeout = 10 * time.Second
	a := e.startWorker("A", storeA, "s", sinkA, opts, false)
	e.caughtUp("s", 30*time.Second)
	b := e.startWorker("B", storeB, "s", sinkB, opts, false)
	e.eventually("B in standby", 10*time.Second, func() bool { return b.w.State().Phase == syncer.PhaseStandby })

	// A's statements now reach the table 4 s after it sends them.
	slow := time.Now()
	sinkProxy.toxic("slow", "latency", "upstream", map[string]any{"latency": 4000})
	var inFlight *callRec
	e.eventually("A to have a sink call under way on the slow link", 10*time.Second, func() bool {
		e.rec.mu.Lock()
		defer e.rec.mu.Unlock()
		for _, c := range e.rec.calls {
			if c.Worker == "A" && c.Start.After(slow) && !c.ended && len(c.Records) > 0 {
				inFlight = c
				return true
			}
		}
		return false
	})
	// Cut the lock session; the server drops it after a second of silence.
	lockProxy.blackHole(time.Second)
	e.eventually("B to take the lease over", 20*time.Second, func() bool { return e.holderOf("s", a, b) == b })
	e.eventually("A's stale call to end", 20*time.Second, func() bool {
		e.rec.mu.Lock()
		defer e.rec.mu.Unlock()
		return inFlight.ended
	})
	sinkProxy.remove("slow")
	lockProxy.heal()

	// The stale call carried keys B had already sent newer versions of.
	e.rec.mu.Lock()
	newer := map[feed.Key]feed.Seq{}
	for _, c := range e.rec.calls {
		if c.Worker == "B" && c.ended && c.Err == nil && c.End.Before(inFlight.End) {
			for _, r := range c.Records {
				newer[r.Key] = max(newer[r.Key], r.Seq)
			}
		}
	}
	overtaken := 0
	for _, r := range inFlight.Records {
		if newer[r.Key] > r.Seq {
			overtaken++
		}
	}
	staleErr := inFlight.Err
	e.rec.mu.Unlock()
	if overtaken == 0 {
		t.Fatalf("A's stale call (%d records, error %v) carried no key B had written newer before it landed: the guard was not put to work", len(inFlight.Records), staleErr)
	}

	load.halt()
	e.caughtUp("s", 30*time.Second)
	regress.stop()
	if n, first := regress.result(); n > 0 {
		t.Errorf("I2: %d times a key's stored seq went down in the table; first: %s", n, first)
	}
	want, _ := e.liveDocs()
	got := map[feed.Key][]byte{}
	rows, err := e.direct.Query(e.ctx, `SELECT key, doc FROM "`+e.schema+`".mirror WHERE doc IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var d []byte
		if err := rows.Scan(&k, &d); err != nil {
			t.Fatal(err)
		}
		got[feed.Key(k)] = d
	}
	sameDocs(t, "table", toRaw(got), want)
	stale, _ := checkI4(t, e.rec)
	if !stale[inFlight] {
		t.Errorf("the call A had under way when B took over is not counted stale")
	}
	t.Logf("A's stale call: %d records, %d of them overtaken by B, landed %v after B's take began (error: %v); %d table reads",
		len(inFlight.Records), overtaken, inFlight.End.Sub(firstTakeOf(e.rec, "B")).Round(time.Millisecond), staleErr, regress.reads())
}

func firstTakeOf(rec *recorder, worker string) time.Time {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, tk := range rec.takes {
		if tk.Worker == worker {
			return tk.Start
		}
	}
	return time.Time{}
}

func toRaw(m map[feed.Key][]byte) map[feed.Key]json.RawMessage {
	out := map[feed.Key]json.RawMessage{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// tableWatch reads the mirror table's stored seqs every 10 ms and counts
// every key whose seq went down since the last read.
type tableWatch struct {
	mu     sync.Mutex
	n      int
	first  string
	nReads int
	quit   chan struct{}
	done   chan struct{}
}

func (e *env) watchTable() *tableWatch {
	w := &tableWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := map[string]int64{}
		for {
			select {
			case <-w.quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rows, err := e.direct.Query(ctx, `SELECT key, seq FROM "`+e.schema+`".mirror`)
			if err != nil {
				cancel()
				continue
			}
			w.mu.Lock()
			w.nReads++
			for rows.Next() {
				var k string
				var s int64
				if rows.Scan(&k, &s) != nil {
					break
				}
				if s < last[k] {
					w.n++
					if w.first == "" {
						w.first = fmt.Sprintf("%s from seq %d to %d", k, last[k], s)
					}
				}
				last[k] = s
			}
			w.mu.Unlock()
			rows.Close()
			cancel()
		}
	}()
	e.t.Cleanup(w.stop)
	return w
}

func (w *tableWatch) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

func (w *tableWatch) result() (int, string) { w.mu.Lock(); defer w.mu.Unlock(); return w.n, w.first }
func (w *tableWatch) reads() int            { w.mu.Lock(); defer w.mu.Unlock(); return w.nReads }
