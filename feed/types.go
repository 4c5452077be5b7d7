package feed

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Seq numbers a feed's rows. Per feed it rises strictly in commit order, is
// never reused by a committed row, and is not reset by a new generation, so a
// cursor of an older generation is always below every row of the current one.
// The first row of a feed has seq 1; seq 0 means "before everything".
type Seq int64

// Generation counts a feed's rebuilds. It starts at 1; a rebuild moves it on
// and empties the feed in the same transaction.
type Generation int64

// FirstGeneration is the generation of a feed that was never rebuilt.
const FirstGeneration Generation = 1

// Cursor is where a sink stands: the generation and seq of the last record it
// durably applied. The zero Cursor means "no cursor": the sink has never
// finished a resync, and must do one.
type Cursor struct {
	Generation Generation
	Seq        Seq
}

// IsZero reports whether c is the absent cursor.
func (c Cursor) IsZero() bool { return c == Cursor{} }

func (c Cursor) String() string {
	if c.IsZero() {
		return "none"
	}
	return fmt.Sprintf("g%d@%d", c.Generation, c.Seq)
}

// validate checks a cursor that is present: generation ≥ 1, seq ≥ 0.
func (c Cursor) validate(field string) error {
	if c.Generation < FirstGeneration {
		return Invalid(field+".generation", "is %d; generations start at 1", c.Generation)
	}
	if c.Seq < 0 {
		return Invalid(field+".seq", "is %d; seqs are never negative", c.Seq)
	}
	return nil
}

// Record is one row of a feed as a reader hands it out: the latest version of
// its key at seq. A nil Doc is a tombstone: the key was deleted.
//
// A reader may cut the documents of one batch out of shared buffers, to read
// a batch with a few allocations rather than one per row: Doc is read-only,
// stays valid for as long as it is kept, and a sink that keeps a few documents
// of a large batch for long should copy them, or it keeps their buffers too.
type Record struct {
	Key Key
	Seq Seq
	Doc json.RawMessage
}

// Deleted reports whether r is a tombstone.
func (r Record) Deleted() bool { return r.Doc == nil }

// Change is one write to a feed: a document for a key (Put), or the key's
// deletion (Delete), which leaves a tombstone. Build them with Put and
// Delete: a deletion is marked as one, and only Delete marks it, so a Put
// whose document is nil by mistake (an unset field, a failed marshal) is
// refused by PrepareChanges rather than deleting the key.
type Change struct {
	Key Key
	// Doc is the key's new document; nil in a deletion.
	Doc json.RawMessage
	// deleted marks a deletion; see Delete.
	deleted bool
}

// Put is a change that sets key's document. doc must be a document (see
// ValidateDocument); a nil doc is refused, never read as a deletion.
func Put(key Key, doc json.RawMessage) Change { return Change{Key: key, Doc: doc} }

// Delete is a change that deletes key: the only way to write a tombstone.
func Delete(key Key) Change { return Change{Key: key, deleted: true} }

// Deleted reports whether c is a deletion, made by Delete.
func (c Change) Deleted() bool { return c.deleted }

// PrepareChanges validates changes and compacts them to one change per key, the
// last one given for that key, keeping the order of each key's last change.
// A change is a valid key with a valid document (Put), or a deletion made by
// Delete; a change with no document that Delete did not make is refused, so
// a tombstone is only ever written on purpose. In the changes it returns, a
// nil Doc is exactly a deletion.
// Writers call it before they write anything: one bad change refuses the whole
// batch. An empty batch is valid and writes nothing.
func PrepareChanges(changes []Change) ([]Change, error) {
	// A field name is built only for the error: this runs on every write,
	// and formatting a name per change cost as much as checking it.
	field := func(i int, part string) string { return "changes[" + strconv.Itoa(i) + "]." + part }
	last := make(map[Key]int, len(changes))
	for i, c := range changes {
		if err := validKey("key", string(c.Key)); err != nil {
			return nil, validKey(field(i, "key"), string(c.Key))
		}
		switch {
		case c.deleted && c.Doc != nil:
			return nil, Invalid(field(i, "doc"), "is set in a deletion; a deletion has no document")
		case c.deleted:
		case c.Doc == nil:
			return nil, Invalid(field(i, "doc"), "is nil; use feed.Delete to delete a key, a nil document is not a deletion")
		default:
			if reason, at := checkDocument(c.Doc); reason != "" {
				return nil, documentInvalid(field(i, "doc"), reason, at)
			}
		}
		last[c.Key] = i
	}
	if len(last) == len(changes) {
		return changes, nil
	}
	out := make([]Change, 0, len(last))
	for i, c := range changes {
		if last[c.Key] == i {
			out = append(out, c)
		}
	}
	return out, nil
}

// WriteResult says where a write landed: its generation and the contiguous seq
// range handed to its changes, in the order PrepareChanges left them. An empty
// write has First = Last = 0.
//
// A write to a feed in the concurrent mode (WriteConcurrent) gets no seqs at
// write time: they are handed out when the feed's sealer seals its rows,
// after the commit. Its result has First = Last = 0 and Unsealed lists the
// keys it wrote; a wait for it (syncer.WaitApplied) first waits for those
// keys to be sealed.
type WriteResult struct {
	Generation Generation
	First      Seq
	Last       Seq
	// Unsealed are the keys of a concurrent-mode write, whose seqs are not
	// known yet; nil for a write of the locked mode.
	Unsealed []Key
}

// WriteMode is how a feed's writers get their seqs, chosen per feed and
// recorded with the feed, so every process agrees.
type WriteMode string

const (
	// WriteLocked is the default: a write takes the feed lock and gets its
	// seqs at once, so writers of one feed serialise across their commits.
	WriteLocked WriteMode = "locked"
	// WriteConcurrent: a write takes no feed lock and leaves its rows
	// unsealed; a sealer, one per feed, gives them seqs in rounds after
	// their commits. Writers of different keys never wait for each other.
	WriteConcurrent WriteMode = "concurrent"
)

// Validate checks m is one of the modes; field names it in the error.
func (m WriteMode) Validate(field string) error {
	if m != WriteLocked && m != WriteConcurrent {
		return Invalid(field, "is %q; it must be %q or %q", string(m), WriteLocked, WriteConcurrent)
	}
	return nil
}

// BatchLimit bounds one read of a feed (Reader.ReadBatch), so that what a
// reader holds in memory is bounded whatever the feed's size and whatever its
// documents' sizes.
type BatchLimit struct {
	// Records is the most records a batch holds, 1 to MaxBatchLimit.
	Records int
	// Bytes bounds the bytes of a batch's keys and documents: a record that
	// would take the batch past Bytes ends it, unread, so a batch holds at
	// most Bytes, or its one first record when that alone is larger (a
	// batch always holds a record when one follows, whatever its size, or a
	// reader could never get past it). 0 means no byte bound; it is never
	// negative.
	Bytes int
}

// Validate checks the limit; field names it in the error.
func (l BatchLimit) Validate(field string) error {
	if l.Records < 1 || l.Records > MaxBatchLimit {
		return Invalid(field+".records", "is %d; it must be 1 to %d", l.Records, MaxBatchLimit)
	}
	if l.Bytes < 0 {
		return Invalid(field+".bytes", "is %d; it must be 0 (no byte bound) or more", l.Bytes)
	}
	return nil
}

// Size is what a record counts for against BatchLimit.Bytes: its key's and
// its document's bytes.
func (r Record) Size() int { return len(r.Key) + len(r.Doc) }

// Batch is what a reader hands out for one read: records in ascending seq
// order, all of Generation, and the feed's Head, all read in one snapshot. A
// batch never holds two records of one key.
type Batch struct {
	Generation Generation
	Head       Seq
	Records    []Record
	// More says records follow the batch in the snapshot it was read in:
	// the read stopped at BatchLimit.Records, or before a record that would
	// have taken it past BatchLimit.Bytes, not at the end of the feed. A
	// batch without More holds every record after the read's seq in its
	// snapshot. This, not the batch's length, is what says a reader has
	// caught up: a batch cut by bytes is short too.
	More bool
}

// LeaseHolder identifies one lease taken: a random id, fresh for every take.
type LeaseHolder string

// ParkedRecord is a record a sink refused for the record's own sake, kept per
// (feed, sink, key) with the seq it was refused at and the sink's reason.
type ParkedRecord struct {
	Key      Key
	Seq      Seq
	Reason   string
	ParkedAt time.Time
}

// ParkChange is what a cursor move does to the sink's parked list, atomically
// with the move. With Replace, the list becomes exactly Park (a resync's
// outcome). Otherwise the keys in Unpark are removed first, then each record of
// Park is added, overwriting a record already parked for its key; a key in both
// ends up parked. Within Park, the last record for a key wins.
type ParkChange struct {
	Replace bool
	Park    []ParkedRecord
	Unpark  []Key
}

// CursorMove is a fenced compare-and-set of a sink's cursor. It lands only when
// Holder is the lease holder recorded for the sink and the cursor is Expected
// (the zero Cursor when the sink has none); then the cursor becomes Next and the
// parked list changes by Parked, in one atomic step. Otherwise nothing changes
// and the store returns a *CursorSupersededError.
//
// Next must also be a place the feed has been: of the feed's generation, at
// or below its head. Tombstone collection trusts every cursor, so a cursor
// past the head would let it delete tombstones the sink never saw. The store
// checks it in the same atomic step as the guard, and refuses, changing
// nothing:
//
//   - a generation older than the feed's with a *CursorSupersededError whose
//     Generation is the feed's: a rebuild won the race with the caller, who
//     must resync;
//   - a generation newer than the feed's, or a seq above the head, with an
//     *InvalidError naming move.next.generation or move.next.seq: the caller
//     never read such a place, so it is a bug, which only the store can see.
//
// A seq below the generation's first row is allowed: a resync of an empty
// generation moves to seq 0.
type CursorMove struct {
	ID       SinkID
	Holder   LeaseHolder
	Expected Cursor
	Next     Cursor
	Parked   ParkChange
}

// Validate checks everything a store can check before it touches its state.
// Stores call it first.
func (m CursorMove) Validate() error {
	if err := m.ID.Validate(); err != nil {
		return err
	}
	if m.Holder == "" {
		return Invalid("move.holder", "must not be empty")
	}
	if !m.Expected.IsZero() {
		if err := m.Expected.validate("move.expected"); err != nil {
			return err
		}
	}
	if err := m.Next.validate("move.next"); err != nil {
		return err
	}
	for i, k := range m.Parked.Unpark {
		if err := validKey(fmt.Sprintf("move.parked.unpark[%d]", i), string(k)); err != nil {
			return err
		}
	}
	for i, p := range m.Parked.Park {
		field := fmt.Sprintf("move.parked.park[%d]", i)
		if err := validKey(field+".key", string(p.Key)); err != nil {
			return err
		}
		if p.Seq < 1 {
			return Invalid(field+".seq", "is %d; a parked record has the seq of a real row (≥ 1)", p.Seq)
		}
		if err := validReason(field+".reason", p.Reason); err != nil {
			return err
		}
		if p.ParkedAt.IsZero() {
			return Invalid(field+".parked_at", "must be set")
		}
	}
	return nil
}

// LeaseState is the lease recorded on a sink's cursor row, as describe reports
// it. ExpiresAt is zero for an advisory-lock holder, which has no expiry: its
// lease lasts as long as its database session.
type LeaseState struct {
	Holder    LeaseHolder
	ExpiresAt time.Time
}

// SinkState is one registered sink in a Description.
type SinkState struct {
	Sink SinkName
	// Cursor is the zero Cursor when the sink has never finished a resync.
	Cursor Cursor
	// LastAdvance is when the cursor last moved; zero when it never has.
	LastAdvance time.Time
	// Lease is nil when no holder is recorded. A recorded holder whose
	// ExpiresAt has passed has lapsed, and any worker may take the lease.
	Lease *LeaseState
	// Parked is the sink's parked list, in key order.
	Parked []ParkedRecord
	// Pending counts the feed's rows (documents and tombstones) above the
	// cursor's seq: what the sink has still to see.
	Pending int64
}

// Description is an operator's report of one feed. Its figures may come from
// more than one snapshot (a batch older or newer than each other); it is for
// reading, and no decision is taken on it.
type Description struct {
	Feed       FeedName
	Generation Generation
	Head       Seq
	// Sinks are the registered sinks, in name order.
	Sinks []SinkState
	// Mode is the feed's write mode; empty from a store that has only the
	// locked one.
	Mode WriteMode
	// Unsealed counts the keys written in the concurrent mode whose latest
	// write is not sealed yet: no sink's Pending counts them until it is.
	Unsealed int64
	// Sealer is the sealer's lease (concurrent mode); nil when none is
	// recorded. A holder whose ExpiresAt has passed has lapsed.
	Sealer *LeaseState
	// OldestTombstone is when the feed's oldest tombstone was made: how
	// long collection has been held back, or has not run. Zero when the
	// feed holds none, or from a store that does not record it.
	OldestTombstone time.Time
}

// Rejection is a sink's refusal of one record for the record's own sake (the
// target refuses that document). The record is parked with Reason; the sink
// moves on.
type Rejection struct {
	Key    Key
	Seq    Seq
	Reason string
}
