package pgfeed_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestCommitOrderTailingReader is guarantee 2 under contention: eight writers
// commit concurrently while a ninth holds its transaction open, with its feed
// rows written, for over a second; a reader tails the feed the whole time.
// Every key is written once, so no row is overwritten, and the reader must
// see every seq from 1 to the head, each above the last it saw. A store that
// handed out seqs in write order rather than commit order (a sequence, say)
// fails: the slow writer's seqs commit after later ones the reader has passed.
func TestCommitOrderTailingReader(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	const f = feed.FeedName("order")
	const writers, commits, perCommit = 8, 20, 3

	var (
		wg      sync.WaitGroup
		written atomic.Int64
		errs    = make(chan error, writers+1)
		started = make(chan struct{})
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range commits {
				if c == commits/2 && w == 0 {
					close(started) // the slow writer starts mid-way
				}
				var changes []feed.Change
				for k := range perCommit {
					changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("w%d-%d-%d", w, c, k)), []byte(`{"w":1}`)))
				}
				if _, err := s.WriteCommitted(ctx, f, changes); err != nil {
					errs <- err
					return
				}
				written.Add(perCommit)
			}
		}()
	}
	var slowHeld time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-started
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			if _, err := s.Write(ctx, tx, f, []feed.Change{feed.Put("slow-1", []byte(`{"s":1}`)), feed.Put("slow-2", []byte(`{"s":2}`))}); err != nil {
				return err
			}
			begin := time.Now()
			time.Sleep(1500 * time.Millisecond) // the feed lock is held all along
			slowHeld = time.Since(begin)
			return nil
		})
		if err != nil {
			errs <- err
			return
		}
		written.Add(2)
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	seen := make(map[feed.Seq]bool)
	var last feed.Seq
	finished := false
	for {
		select {
		case err := <-errs:
			t.Fatalf("writer: %v", err)
		case <-done:
			finished = true
		default:
		}
		b, err := s.ReadBatch(ctx, f, last, feed.BatchLimit{Records: 7})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if r.Seq <= last {
				t.Fatalf("the reader at seq %d was handed seq %d", last, r.Seq)
			}
			last = r.Seq
			seen[r.Seq] = true
		}
		if len(b.Records) == 0 {
			if finished {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	head, err := s.Head(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(writers*commits*perCommit + 2)
	if int64(head) != want || written.Load() != want {
		t.Fatalf("head %d, written %d; want %d", head, written.Load(), want)
	}
	for q := feed.Seq(1); q <= head; q++ {
		if !seen[q] {
			t.Errorf("the tailing reader skipped seq %d (it read up to %d)", q, last)
		}
	}
	if slowHeld < time.Second {
		t.Errorf("the slow writer held its transaction %v; the test needs over a second", slowHeld)
	}
}
