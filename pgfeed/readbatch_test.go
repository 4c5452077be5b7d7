package pgfeed_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestReadBatchBuffers: ReadBatch cuts a batch's keys and documents out of
// shared buffers (see Store.ReadBatch). Every record must still read back as
// written, whatever the documents' sizes (small ones, and ones larger than a
// whole buffer), with tombstones as nil documents, in every exec mode; and an
// append to one document must never write into the next.
func TestReadBatchBuffers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, setup(t, pgtest.URL(), m.mode), pgfeed.Options{})
			ctx := t.Context()

			empty, err := s.ReadBatch(ctx, "never-written", 0, feed.BatchLimit{Records: 10})
			if err != nil {
				t.Fatal(err)
			}
			if empty.Generation != feed.FirstGeneration || empty.Head != 0 || len(empty.Records) != 0 {
				t.Fatalf("a feed never written reads as %+v, want generation 1, head 0, no records", empty)
			}

			var changes []feed.Change
			for i := range 300 {
				k := feed.Key(fmt.Sprintf("clé-%03d-✓", i))
				switch {
				case i%7 == 3:
					changes = append(changes, feed.Delete(k))
				case i%50 == 10: // larger than any one document buffer
					changes = append(changes, feed.Put(k, json.RawMessage(fmt.Sprintf(`{"i": %d, "pad": "%s"}`, i, strings.Repeat("x", 300_000)))))
				default:
					changes = append(changes, feed.Put(k, json.RawMessage(fmt.Sprintf(`{"i": %d, "s": "%s"}`, i, strings.Repeat("é", i)))))
				}
			}
			res, err := s.WriteCommitted(ctx, "f", changes)
			if err != nil {
				t.Fatal(err)
			}
			b, err := s.ReadBatch(ctx, "f", 0, feed.BatchLimit{Records: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if b.Generation != feed.FirstGeneration || b.Head != res.Last || len(b.Records) != len(changes) {
				t.Fatalf("batch generation %d head %d with %d records, want 1, %d, %d", b.Generation, b.Head, len(b.Records), res.Last, len(changes))
			}
			for i, r := range b.Records {
				c := changes[i]
				if r.Key != c.Key || r.Seq != res.First+feed.Seq(i) {
					t.Fatalf("record %d is %q at %d, want %q at %d", i, r.Key, r.Seq, c.Key, res.First+feed.Seq(i))
				}
				if (r.Doc == nil) != (c.Doc == nil) || (c.Doc != nil && !feedtest.JSONEqual(r.Doc, c.Doc)) {
					t.Fatalf("record %d (%q) has document %.80q, want %.80q", i, r.Key, r.Doc, c.Doc)
				}
			}
			// An append to a document gets a copy: the next record's bytes
			// stay what they were.
			for i := 0; i+1 < len(b.Records); i++ {
				next := string(b.Records[i+1].Doc)
				_ = append(b.Records[i].Doc, `,"overwritten":true}`...)
				if string(b.Records[i+1].Doc) != next {
					t.Fatalf("an append to record %d's document changed record %d's", i, i+1)
				}
			}

			after, err := s.ReadBatch(ctx, "f", res.Last, feed.BatchLimit{Records: 10})
			if err != nil {
				t.Fatal(err)
			}
			if after.Generation != feed.FirstGeneration || after.Head != res.Last || len(after.Records) != 0 {
				t.Fatalf("the read after the head is %+v, want generation 1, head %d, no records", after, res.Last)
			}
		})
	}
}

// readBatch is the one call of ReadBatch in the race test below.
func readBatch(ctx context.Context, s *pgfeed.Store, f feed.FeedName, after feed.Seq, limit int) (feed.Batch, error) {
	return s.ReadBatch(ctx, f, after, feed.BatchLimit{Records: limit})
}

// TestReadBatchOneSnapshot races rebuilds and writes against reads. Every
// document says the generation it was written in, so a batch whose
// generation and rows came from two snapshots shows: a record of another
// generation than the batch's, or a head below the batch's last seq. A
// ReadBatch that reads the generation and the rows in two statements fails
// this in either order, since a rebuild may land between them.
func TestReadBatchOneSnapshot(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const f = feed.FeedName("raced")
	keys := []feed.Key{"a", "b", "c", "d", "e"}
	write := func(gen feed.Generation, n int) error {
		var changes []feed.Change
		for i := range n {
			changes = append(changes, feed.Put(keys[(int(gen)+i)%len(keys)], json.RawMessage(fmt.Sprintf(`{"g":%d}`, gen))))
		}
		res, err := s.WriteCommitted(ctx, f, changes)
		if err == nil && res.Generation != gen {
			err = fmt.Errorf("a write landed in generation %d, want %d: only this goroutine rebuilds", res.Generation, gen)
		}
		return err
	}
	if err := write(1, 3); err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		reads   atomic.Int64
		mu      sync.Mutex
		failure string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if failure == "" {
			failure = fmt.Sprintf(format, args...)
		}
		stop.Store(true)
	}
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for after := feed.Seq(0); !stop.Load(); reads.Add(1) {
				b, err := readBatch(ctx, s, f, after, 1000)
				if err != nil {
					fail("ReadBatch: %v", err)
					return
				}
				for _, rec := range b.Records {
					var d struct{ G feed.Generation }
					if err := json.Unmarshal(rec.Doc, &d); err != nil || d.G != b.Generation {
						fail("reader %d: a batch of generation %d (head %d) holds %s@%d written in generation %d (%v)", r, b.Generation, b.Head, rec.Key, rec.Seq, d.G, err)
						return
					}
				}
				if n := len(b.Records); n > 0 && b.Records[n-1].Seq > b.Head {
					fail("reader %d: a batch's head %d is below its last seq %d", r, b.Head, b.Records[n-1].Seq)
					return
				}
				after = max(b.Head-2, 0) * feed.Seq(r) // reader 0 reads the whole feed, reader 1 its tail
			}
		}()
	}
	gen := feed.Generation(1)
	for i := 0; i < 150 && !stop.Load(); i++ {
		if i%3 == 0 {
			err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
				g, err := s.ResetTx(ctx, tx, f)
				gen = g
				return err
			})
			if err != nil {
				fail("rebuild: %v", err)
				break
			}
		}
		if err := write(gen, 1+i%3); err != nil {
			fail("write: %v", err)
			break
		}
		time.Sleep(2 * time.Millisecond) // let reads interleave
	}
	stop.Store(true)
	wg.Wait()
	if failure != "" {
		t.Fatal(failure)
	}
	if reads.Load() < 20 {
		t.Fatalf("only %d reads raced the rebuilds: the test proves little", reads.Load())
	}
}
