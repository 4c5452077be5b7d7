package pgfeed

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// KeyTrace is where one key of a feed stands, everywhere, read in one
// snapshot: the key's row in the feed, and for each registered sink whether
// the sink has it. It answers an operator's "why is this record not in my
// index?".
type KeyTrace struct {
	Feed       feed.FeedName
	Key        feed.Key
	Generation feed.Generation
	Head       feed.Seq
	// Found says the feed has a row for the key: a document, or a tombstone
	// (Doc nil) not collected yet. A key not found was never written in this
	// generation, or was deleted and its tombstone collected.
	Found bool
	Seq   feed.Seq
	Doc   json.RawMessage
	// Unsealed says a write of the key in the concurrent mode waits for
	// the sealer: UnsealedDoc is its document (nil: a delete). Until it is
	// sealed, Found, Seq and Doc are the sealed version, if any, which is
	// what the sinks are owed.
	Unsealed    bool
	UnsealedDoc json.RawMessage
	// Recorded says a captured change of the key waits for the sealer,
	// recorded by key (see the package doc's # Keyed capture): the sealer
	// reads its document from the table when it seals it, so there is no
	// document to show before.
	Recorded bool
	// Sinks are the registered sinks, in name order.
	Sinks []SinkTrace
}

// KeyState is what one sink has of a key.
type KeyState string

const (
	// KeyApplied: the sink's cursor, in the feed's generation, has passed
	// the key's row; the sink holds that version (or, for a tombstone, no
	// longer holds the key).
	KeyApplied KeyState = "applied"
	// KeyPending: the cursor is below the key's row; Ahead rows come first.
	KeyPending KeyState = "pending"
	// KeyParked: the sink refused this version of the key; Parked says why.
	KeyParked KeyState = "parked"
	// KeyResyncing: the sink is filling a fresh copy for the feed's
	// generation (its cursor is in an older one, or it has none yet).
	KeyResyncing KeyState = "resyncing"
	// KeyAbsent: the feed has no row for the key, so no sink is owed one.
	KeyAbsent KeyState = "absent"
)

// SinkTrace is one sink's part of a KeyTrace.
type SinkTrace struct {
	Sink   feed.SinkName
	Cursor feed.Cursor
	State  KeyState
	// Ahead counts the feed's rows between the cursor and the key's row,
	// which the sink sees first; set when State is KeyPending.
	Ahead int64
	// Parked is the key's parked record for the sink, if it has one: the
	// reason for KeyParked, or an older version's refusal that a newer
	// write of the key has overtaken.
	Parked *feed.ParkedRecord
}

// Trace reports where key stands in feed f and in each of its sinks, or
// refuses a feed it does not know with a *feed.UnknownFeedError.
func (s *Store) Trace(ctx context.Context, f feed.FeedName, key feed.Key) (KeyTrace, error) {
	if err := f.Validate(); err != nil {
		return KeyTrace{}, err
	}
	if err := key.Validate(); err != nil {
		return KeyTrace{}, err
	}
	fail := func(err error) (KeyTrace, error) {
		return KeyTrace{}, feed.Unreadable("tracing key "+string(key)+" of feed "+string(f), err)
	}
	rows, err := s.db.Query(ctx, s.sql.traceKey, string(f), string(key))
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	t := KeyTrace{Feed: f, Key: key}
	known := false
	for rows.Next() {
		var (
			gen, head  int64
			rowSeq     *int64
			doc        []byte
			pending    bool
			pendingDoc []byte
			sink       *string
			cgen, cseq *int64
			pseq       *int64
			preason    *string
			pat        *time.Time
			ahead      *int64
		)
		if err := rows.Scan(&gen, &head, &known, &rowSeq, &doc, &pending, &pendingDoc, &t.Recorded, &sink, &cgen, &cseq, &pseq, &preason, &pat, &ahead); err != nil {
			return fail(err)
		}
		t.Generation, t.Head = feed.Generation(gen), feed.Seq(head)
		if rowSeq != nil {
			t.Found, t.Seq = true, feed.Seq(*rowSeq)
			if doc != nil {
				t.Doc = json.RawMessage(doc)
			}
		}
		if pending {
			t.Unsealed = true
			if pendingDoc != nil {
				t.UnsealedDoc = json.RawMessage(pendingDoc)
			}
		}
		if sink == nil {
			continue
		}
		st := SinkTrace{Sink: feed.SinkName(*sink)}
		if cgen != nil && cseq != nil {
			st.Cursor = feed.Cursor{Generation: feed.Generation(*cgen), Seq: feed.Seq(*cseq)}
		}
		if pseq != nil {
			st.Parked = &feed.ParkedRecord{Key: key, Seq: feed.Seq(*pseq), Reason: *preason, ParkedAt: *pat}
		}
		switch {
		case !t.Found:
			st.State = KeyAbsent
		case st.Parked != nil && st.Parked.Seq == t.Seq:
			st.State = KeyParked
		case st.Cursor.Generation < t.Generation:
			st.State = KeyResyncing
		case st.Cursor.Seq >= t.Seq:
			st.State = KeyApplied
		default:
			st.State = KeyPending
			if ahead != nil {
				st.Ahead = *ahead
			}
		}
		t.Sinks = append(t.Sinks, st)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if !known {
		return KeyTrace{}, &feed.UnknownFeedError{Feed: f}
	}
	return t, nil
}
