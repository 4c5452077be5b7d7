package syncer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/syncer"
)

// TestBatchesCutByBytes mirrors documents larger than half of
// Options.BatchBytes, so that every batch is cut by bytes after one record
// and is far shorter than BatchSize. A resync under writes must still stream
// to the feed's end and publish an exact copy (a short batch is not the end
// when the reader says more follows), and a catch-up must send every record
// after the cursor, none skipped, one document per batch, and ask the reader
// for few records once it has seen a batch cut by bytes.
func TestBatchesCutByBytes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		const batchBytes = 4096
		pad := strings.Repeat("p", batchBytes/2)
		// In jsonb's own text form, so that every store hands the document
		// out at this length.
		big := func(n int) json.RawMessage { return doc(`{"n": %d, "pad": "%s"}`, n, pad) }
		for i := range 12 {
			e.write(feed.Put(key(i), big(i)))
		}
		e.write(feed.Delete(key(5)))
		opts := testOptions(t, e)
		opts.BatchSize = 100
		opts.BatchBytes = batchBytes

		w := newWorld(e, "search")
		var mu sync.Mutex
		applies, publishErr, published := 0, "", false
		w.setHook(func(ctx context.Context, c *call) error {
			mu.Lock()
			defer mu.Unlock()
			switch c.Op {
			case "target-apply":
				if applies++; applies == 3 {
					// Behind the stream and ahead of it.
					e.write(feed.Put(key(0), big(100)), feed.Delete(key(9)), feed.Put(key(50), big(50)))
				}
			case "publish":
				published = true
				want, _ := e.liveDocs()
				got := c.target.docs()
				if len(got) != len(want) {
					publishErr = fmt.Sprintf("the target has %d keys at publish, the feed %d", len(got), len(want))
				}
				for k, v := range want {
					if !feedtest.JSONEqual(got[k], v) {
						publishErr = fmt.Sprintf("at publish, %q is %.40s in the target and %.40s in the feed", k, got[k], v)
					}
				}
			}
			return nil
		})
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		mu.Lock()
		if !published || publishErr != "" {
			t.Fatalf("published %v: %s", published, publishErr)
		}
		mu.Unlock()
		_, last := e.liveDocs()
		var streamed []feed.Seq
		batches := 0
		for _, c := range w.log() {
			switch c.Op {
			case "apply":
				t.Fatalf("an incremental apply followed the resync: its cursor stopped short")
			case "target-apply":
				if len(c.Seqs) > 2 {
					t.Fatalf("a resync batch of %d records; two documents cannot share the %d-byte bound, only a tombstone fits beside one", len(c.Seqs), batchBytes)
				}
				batches++
				streamed = append(streamed, c.Seqs...)
			}
		}
		if n := len(streamed); n < 14 || streamed[n-1] != last.Head || batches < len(w.docs()) {
			t.Fatalf("the resync streamed seqs %v in %d batches; want them up to the head %d, a batch per document", streamed, batches, last.Head)
		}
		if c := e.cursor(w.id); c.Seq != last.Head {
			t.Fatalf("cursor %v after the resync, want seq %d", c, last.Head)
		}
		run.stop()

		// Catch-up: every record after the cursor, one per batch.
		before := e.cursor(w.id)
		for i := 20; i < 35; i++ {
			e.write(feed.Put(key(i), big(i)))
		}
		e.write(feed.Delete(key(21)), feed.Put(key(3), big(300)))
		earlier := len(w.log())
		reads := &limitSpy{Reader: e.h.Reader}
		lease := newSpy(e.h.Store)
		run = start(t, e, reads, lease, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", lease)}}, opts)
		e.waitCaughtUp(w.id)
		run.stop()
		// Once a batch came back cut by bytes, the worker asks for few
		// records: a reader that drops what passes the byte bound would
		// otherwise read up to BatchSize large documents to keep one.
		reads.mu.Lock()
		wide := 0
		for _, l := range reads.limits {
			if l.Records > 8 {
				wide++
			}
		}
		if wide > 1 || len(reads.limits) < 15 {
			t.Errorf("the catch-up read with limits %v: want only its first read at the batch size, the rest a few records", reads.limits)
		}
		reads.mu.Unlock()
		want, after := e.liveDocs()
		var sent []feed.Seq
		batches = 0
		for _, c := range w.log()[earlier:] {
			if c.Op != "apply" {
				t.Fatalf("a %s call during an incremental catch-up", c.Op)
			}
			if len(c.Seqs) > 2 {
				t.Fatalf("a catch-up batch of %d records; two documents cannot share the %d-byte bound, only a tombstone fits beside one", len(c.Seqs), batchBytes)
			}
			batches++
			sent = append(sent, c.Seqs...)
		}
		var rows []feed.Seq
		b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, before.Seq, feed.BatchLimit{Records: feed.MaxBatchLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range b.Records {
			rows = append(rows, r.Seq)
		}
		if fmt.Sprint(sent) != fmt.Sprint(rows) || batches < 15 {
			t.Fatalf("the catch-up sent seqs %v in %d batches; the feed has %v after the cursor %v, 16 of them documents", sent, batches, rows, before)
		}
		sameDocs(t, "sink", w.docs(), want)
		noProblems(t, w)
		if c := e.cursor(w.id); c.Seq != after.Head {
			t.Fatalf("cursor %v after the catch-up, want seq %d", c, after.Head)
		}
	})
}

// limitSpy records the limits a worker reads the feed with.
type limitSpy struct {
	feed.Reader
	mu     sync.Mutex
	limits []feed.BatchLimit
}

func (r *limitSpy) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	r.mu.Lock()
	r.limits = append(r.limits, limit)
	r.mu.Unlock()
	return r.Reader.ReadBatch(ctx, f, after, limit)
}

// TestBatchBytesDefault checks that a worker left to the defaults reads with
// both bounds, DefaultBatchBytes among them, and that a set BatchBytes
// reaches the reader as it is.
func TestBatchBytesDefault(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.write(feed.Put(key(1), doc(`{"n": 1}`)))
		for _, c := range []struct {
			set  int
			want feed.BatchLimit
		}{
			{0, feed.BatchLimit{Records: syncer.DefaultBatchSize, Bytes: syncer.DefaultBatchBytes}},
			{12345, feed.BatchLimit{Records: syncer.DefaultBatchSize, Bytes: 12345}},
		} {
			w := newWorld(e, fmt.Sprintf("s%d", c.set))
			spy := &limitSpy{Reader: e.h.Reader}
			opts := testOptions(t, e)
			opts.BatchSize, opts.BatchBytes = 0, c.set
			lease := newSpy(e.h.Store)
			run := start(t, e, spy, lease, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", lease)}}, opts)
			e.waitCaughtUp(w.id)
			run.stop()
			spy.mu.Lock()
			for _, l := range spy.limits {
				if l != c.want {
					t.Errorf("BatchBytes %d: the worker read with %+v, want %+v", c.set, l, c.want)
				}
			}
			if len(spy.limits) == 0 {
				t.Errorf("BatchBytes %d: the worker never read", c.set)
			}
			spy.mu.Unlock()
		}
	})
}
