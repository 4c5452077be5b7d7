package faults_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

// Fault 5, in process, on every sink with a seq guard, in two tests that
// run side by side: the PostgreSQL table, Redis, the file and the bleve
// index in one; MariaDB, NATS JetStream, a webhook receiver (a real HTTP
// server on the loopback, behind the webhook package's NewHandler, keeping
// each key's seq as the package says a receiver must) and Kafka in the
// other. Kafka runs on kfake, franz-go's in-process cluster, since no Kafka
// broker can run where the tests do; Kafka keeps whatever is produced, so
// its guard is the consumer's, and the topic is read and probed through the
// sink's Reader, as every consumer must read it.
//
// Worker A holds lease rows on every sink; B stands by. A reads a batch,
// passes its EnsureHeld, and freezes before the send (the recorder's hook,
// which sits exactly there: the worker calls the sink right after
// EnsureHeld). While it is frozen its sessions are gone, as a stopped
// process's heartbeats are; the keys are written again; for at least
// 2 × ttl, and until B, who took the lapsed lease, has sent the newer
// versions everywhere. Then A wakes and its stale call goes out, with the
// deadline it would have had on waking. Every sink's seq guard makes that
// call a no-op: no key goes back (I2, read from the targets themselves
// after every call), A starts no call but the one frozen (I4), its cursor
// move is refused (B's holder stays on the row and the cursor at the head),
// and every sink ends equal to the feed (I1).
func TestWorkerPausedBeforeSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pausedBeforeSend(t, e, pgtableTarget(t, e.ctx), redisTarget(t, e.ctx, e.allKeys), fileTarget(t, ""), bleveTarget(t, e.ctx, "", e.allKeys))
}

// TestWorkerPausedBeforeSendMore is fault 5 on the other sinks with a seq
// guard (TestWorkerPausedBeforeSend's doc).
func TestWorkerPausedBeforeSendMore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pausedBeforeSend(t, e, mysqlTarget(t, e.ctx), natsTarget(t, e.ctx), webhookTarget(t, e.ctx, e.feed), kafkaTarget(t, e.ctx, e.feed))
}

func pausedBeforeSend(t *testing.T, e *env, targets ...*target) {
	recs := make([]*recorder, len(targets))
	names := make([]feed.SinkName, len(targets))
	for i, tg := range targets {
		recs[i] = newRecorder(tg.probe)
		names[i] = tg.name
	}
	opts := syncer.Options{BatchSize: 100, MoveInterval: -1}
	a := e.newWorker("A", false, targets, recs, opts)
	e.put(0, 100)
	eventually(t, "A holds every sink, caught up", 30*time.Second, func() bool { return a.holds() && e.caughtUp(names...)() })
	b := e.newWorker("B", false, targets, recs, opts)
	eventually(t, "B stands by", 30*time.Second, func() bool { return len(b.runner.States()) == len(targets) })

	// Every A worker that reaches a send freezes there; once all have, A's
	// sessions go.
	arrived := make(chan int, len(recs))
	wake := make(chan struct{})
	for i, r := range recs {
		var once sync.Once
		r.setBefore(func(ctx context.Context, proc, op string, rs []feed.Record) context.Context {
			if proc != "A" {
				return ctx
			}
			once.Do(func() { arrived <- i })
			<-wake
			return context.WithoutCancel(ctx)
		})
	}
	before := time.Now() // A is caught up: every call of A from here on is one it froze in or a later one
	e.put(0, 50)         // version 2 of 50 keys: A takes them and freezes
	for range recs {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("A did not reach a send to every sink")
		}
	}
	e.cut(a)
	v3 := e.put(0, 50) // version 3, which only B can send
	began := time.Now()
	eventually(t, "B sent version 3 everywhere", 60*time.Second, func() bool {
		for _, tg := range targets {
			got, err := tg.probe(e.ctx, []feed.Key{key(0), key(49)})
			if err != nil || got[key(0)] < v3.First || got[key(49)] < v3.Last {
				return false
			}
		}
		return true
	})
	if wait := 2*e.lease.TTL - time.Since(began); wait > 0 {
		time.Sleep(wait) // A stays frozen for 2 × ttl at least
	}
	a.restore()
	close(wake)
	eventually(t, "every sink at the head under B", 30*time.Second, func() bool { return b.holds() && e.caughtUp(names...)() })
	time.Sleep(500 * time.Millisecond) // A's stale calls and refused moves land
	if !e.caughtUp(names...)() {
		t.Errorf("I4: a cursor moved back after A woke")
	}
	hs := e.holders()
	for _, s := range b.runner.States() {
		if hs[s.ID.Sink] != s.Holder {
			t.Errorf("I4: %s's row names %s, want B's %s", s.ID.Sink, hs[s.ID.Sink], s.Holder)
		}
	}
	e.checkSinks(t, targets...)
	for i, r := range recs {
		if targets[i].file != "" {
			checkFileLines(t, targets[i].file) // the file folds to each key's highest seq: its lines show a stale append
		}
		r.checkNoRegress(t, targets[i].name)
		stale, landed := 0, false
		for _, c := range r.snapshot() {
			if c.proc == "A" && c.start.After(before) {
				stale++
				landed = landed || (c.op == "apply" && c.err == nil)
			}
		}
		if stale > 1 {
			t.Errorf("I4: A started %d calls to %s since it froze; at most the frozen one may land", stale, targets[i].name)
		}
		if !landed {
			t.Errorf("A's frozen call to %s did not land: the sink's guard was never put to the test", targets[i].name)
		}
	}
	a.stop()
	b.stop()
	e.checkReleased(t, names...)
}

// Fault 5, across processes. Two `kairos run` daemons share a PostgreSQL
// table and a file under lease rows (ttl 2s). While a writer commits
// without pause, A, the holder, is stopped with SIGSTOP for 2 × ttl: its
// heartbeats stop with it, its leases lapse, B takes them over and sends
// on. A then gets SIGCONT and finds itself mid-way through whatever it was
// doing, possibly a send its EnsureHeld let through before the stop. No key
// goes back in the table (I2, watcher) nor in the file's own lines, A's
// holders never come back (I5), both sinks end equal to the feed (I1), and
// both daemons stop cleanly with nothing left held (I6).
func TestDaemonStoppedAndContinued(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	target := pgtest.Schema(t)
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	body := fmt.Sprintf(daemonBody, e.schema, sinkURL(pgtest.URL()), target, path)
	a, b := newDaemon(t, "A", pgtest.URL(), body), newDaemon(t, "B", pgtest.URL(), body)
	sinks := []feed.SinkName{"table", "export"}
	a.start()
	e.put(0, 500)
	eventually(t, "A caught up", 60*time.Second, e.caughtUp(sinks...))
	held := e.holders()
	b.start()
	w := e.watch(e.pool, `"`+target+`".orders`)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			cs := make([]feed.Change, 10)
			for j := range cs {
				cs[j] = e.change(key(i*10%500+j), false)
			}
			if _, err := e.store.WriteCommitted(e.ctx, e.feed, cs); err != nil {
				t.Errorf("write: %v", err)
				return
			}
		}
	})
	time.Sleep(500 * time.Millisecond)
	a.signal(syscall.SIGSTOP)
	stopped := time.Now()
	eventually(t, "B took both sinks over", 30*time.Second, func() bool {
		h := e.holders()
		return h["table"] != "" && h["table"] != held["table"] && h["export"] != "" && h["export"] != held["export"]
	})
	if wait := 2*e.lease.TTL - time.Since(stopped); wait > 0 {
		time.Sleep(wait)
	}
	a.signal(syscall.SIGCONT)
	t.Logf("A stopped for %v", time.Since(stopped).Round(time.Millisecond))
	time.Sleep(time.Second) // A wakes while the writer still writes
	close(stop)
	wg.Wait()
	eventually(t, "caught up", 60*time.Second, e.caughtUp(sinks...))
	w.stop(t)
	want, _ := live(e.ctx, t, e.store, e.feed)
	sameDocs(t, "the table", readTable(t, e, target), want, nil)
	docs, err := file.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	sameDocs(t, "the file", docs, want, nil)
	checkFileLines(t, path)
	a.term()
	b.term()
	e.checkReleased(t, sinks...)
	if n := e.sessionsLeft(a, b); n != 0 {
		t.Errorf("I6: %d database sessions of the stopped daemons are left", n)
	}
}
