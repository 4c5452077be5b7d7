package pgfeed_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

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
