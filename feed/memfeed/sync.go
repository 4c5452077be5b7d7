package memfeed

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/leaserow"
)

// live reports whether a holder is recorded and its expiry has not passed.
func (st *sinkState) live(now time.Time) bool {
	return st.holder != "" && st.expires.After(now)
}

// AcquireLease takes the lease row of id; see feed.SyncStore. The row is free
// when no holder is recorded or the recorded one's expiry has passed.
func (s *Store) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, feed.WriteFailed("taking the lease of "+id.String(), err)
	}
	s.mu.Lock()
	fs := s.feedLocked(id.Feed)
	st := fs.sinks[id.Sink]
	if st == nil {
		st = &sinkState{parked: make(map[feed.Key]feed.ParkedRecord)}
		fs.sinks[id.Sink] = st
	}
	now := s.clock.Now()
	if st.live(now) && !s.faults.leaseTakesLive {
		held := &feed.LeaseHeldError{ID: id, Holder: st.holder, ExpiresAt: st.expires}
		s.mu.Unlock()
		return nil, held
	}
	holder := newHolder()
	st.holder, st.expires = holder, now.Add(s.lease.TTL)
	s.mu.Unlock()

	timings := s.lease
	if s.faults.ensureHeldIgnoresMargin {
		timings.Margin = time.Nanosecond
	}
	return leaserow.Start(ctx, leaserow.Config{
		ID:      id,
		Holder:  holder,
		Timings: timings,
		Clock:   s.clock,
		TakenAt: now,
		Logger:  s.logger,
		Renew: func(ctx context.Context, at time.Time) (bool, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			st := s.feedLocked(id.Feed).sinks[id.Sink]
			if st == nil || st.holder != holder {
				return false, nil
			}
			if exp := at.Add(s.lease.TTL); exp.After(st.expires) {
				st.expires = exp
			}
			return true, nil
		},
		Clear: func(context.Context) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if st := s.feedLocked(id.Feed).sinks[id.Sink]; st != nil && st.holder == holder {
				st.holder, st.expires = "", time.Time{}
			}
			return nil
		},
	}), nil
}

// ReadCursor returns id's cursor; see feed.SyncStore.
func (s *Store) ReadCursor(_ context.Context, id feed.SinkID) (feed.Cursor, error) {
	if err := id.Validate(); err != nil {
		return feed.Cursor{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.feedLocked(id.Feed).sinks[id.Sink]; st != nil {
		return st.cursor, nil
	}
	return feed.Cursor{}, nil
}

// CASCursor makes the fenced move m; see feed.CursorMove.
func (s *Store) CASCursor(_ context.Context, m feed.CursorMove) error {
	if err := m.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(m.ID.Feed)
	if !s.faults.casTrustsNext {
		// The feed's place first, then the sink's guard, as pgfeed decides.
		switch {
		case m.Next.Generation > fs.generation:
			return feed.Invalid("move.next.generation", "is %d; the feed is at generation %d", m.Next.Generation, fs.generation)
		case m.Next.Generation < fs.generation:
			return &feed.CursorSupersededError{ID: m.ID, Generation: fs.generation}
		case m.Next.Seq > fs.head:
			return feed.Invalid("move.next.seq", "is %d, above the feed's head %d; a cursor moves only past seqs the feed handed out", m.Next.Seq, fs.head)
		}
	}
	st := fs.sinks[m.ID.Sink]
	if st == nil {
		return &feed.CursorSupersededError{ID: m.ID}
	}
	holderOK := st.holder == m.Holder || s.faults.casIgnoresHolder
	cursorOK := st.cursor == m.Expected || s.faults.casIgnoresExpected
	if !holderOK || !cursorOK {
		if s.faults.parkSurvivesRefusedCAS {
			applyParks(st, m.Parked)
		}
		return &feed.CursorSupersededError{ID: m.ID}
	}
	st.cursor = m.Next
	st.lastAdvance = s.clock.Now()
	applyParks(st, m.Parked)
	if !s.faults.moveWakesNobody {
		fs.wakeCursors()
	}
	return nil
}

// applyParks is the one home of ParkChange's order: replace, or unpark then
// park, the last park of a key winning.
func applyParks(st *sinkState, c feed.ParkChange) {
	if c.Replace {
		clear(st.parked)
	} else {
		for _, k := range c.Unpark {
			delete(st.parked, k)
		}
	}
	for _, p := range c.Park {
		st.parked[p.Key] = p
	}
}

// ReadParked returns id's parked records in key order.
func (s *Store) ReadParked(_ context.Context, id feed.SinkID) ([]feed.ParkedRecord, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.feedLocked(id.Feed).sinks[id.Sink]
	if st == nil {
		return nil, nil
	}
	return sortedParks(st.parked), nil
}

func sortedParks(m map[feed.Key]feed.ParkedRecord) []feed.ParkedRecord {
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b feed.ParkedRecord) int { return strings.Compare(string(a.Key), string(b.Key)) })
	return out
}

// RetryParked unparks key for id and restamps its row; see feed.SyncStore. It
// holds the feed lock, as a writer does, so the new seq cannot commit out of
// order with a writer's transaction that is open.
func (s *Store) RetryParked(ctx context.Context, id feed.SinkID, key feed.Key) (bool, error) {
	if err := id.Validate(); err != nil {
		return false, err
	}
	if err := key.Validate(); err != nil {
		return false, err
	}
	fs, err := s.lockFeed(ctx, id.Feed)
	if err != nil {
		return false, err
	}
	defer s.unlockFeed(fs)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := fs.sinks[id.Sink]
	if st == nil {
		return false, nil
	}
	if _, ok := st.parked[key]; !ok {
		return false, nil
	}
	delete(st.parked, key)
	if r, ok := fs.rows[key]; ok && !s.faults.retryKeepsSeq {
		fs.head++
		r.seq = fs.head
		fs.put(key, r)
		fs.wake()
	}
	return true, nil
}

// CollectTombstones deletes the tombstones every registered sink has passed;
// see feed.SyncStore for the rule.
func (s *Store) CollectTombstones(_ context.Context, f feed.FeedName) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	if len(fs.sinks) == 0 {
		return 0, nil
	}
	upTo := feed.Seq(-1)
	parked := make(map[feed.Key]bool)
	for _, st := range fs.sinks {
		if st.cursor.IsZero() {
			if s.faults.collectIgnoresCursorless {
				continue
			}
			return 0, nil
		}
		if upTo < 0 || st.cursor.Seq < upTo {
			upTo = st.cursor.Seq
		}
		if !s.faults.collectIgnoresParked {
			for k := range st.parked {
				parked[k] = true
			}
		}
	}
	n := 0
	for key, r := range fs.rows {
		if _, unsealed := fs.pending[key]; unsealed && !s.faults.collectIgnoresPending {
			continue // deleting the row would lose the unsealed put beside it
		}
		if r.doc == nil && r.seq <= upTo && !parked[key] {
			fs.remove(key)
			n++
		}
	}
	return n, nil
}

// RemoveSink unregisters id; see feed.SyncStore.
func (s *Store) RemoveSink(_ context.Context, id feed.SinkID) (bool, error) {
	if err := id.Validate(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(id.Feed)
	st := fs.sinks[id.Sink]
	if st == nil {
		return false, nil
	}
	if st.live(s.clock.Now()) {
		return false, &feed.LeaseHeldError{ID: id, Holder: st.holder, ExpiresAt: st.expires}
	}
	delete(fs.sinks, id.Sink)
	return true, nil
}

// Describe reports f for an operator, or refuses a feed it does not know;
// see feed.SyncStore and feed.Description.
func (s *Store) Describe(_ context.Context, f feed.FeedName) (feed.Description, error) {
	if err := f.Validate(); err != nil {
		return feed.Description{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	if !fs.recorded && len(fs.sinks) == 0 {
		return feed.Description{}, &feed.UnknownFeedError{Feed: f}
	}
	d := feed.Description{Feed: f, Generation: fs.generation, Head: fs.head, Mode: feed.WriteLocked, Unsealed: int64(len(fs.pending))}
	if fs.mode != "" {
		d.Mode = fs.mode
	}
	if fs.sealer != "" {
		d.Sealer = &feed.LeaseState{Holder: fs.sealer, ExpiresAt: fs.sealerExpires}
	}
	for _, name := range slices.Sorted(maps.Keys(fs.sinks)) {
		st := fs.sinks[name]
		ss := feed.SinkState{
			Sink:        name,
			Cursor:      st.cursor,
			LastAdvance: st.lastAdvance,
			Parked:      sortedParks(st.parked),
		}
		if st.holder != "" {
			ss.Lease = &feed.LeaseState{Holder: st.holder, ExpiresAt: st.expires}
		}
		for _, r := range fs.rows {
			if r.seq > st.cursor.Seq {
				ss.Pending++
			}
		}
		d.Sinks = append(d.Sinks, ss)
	}
	return d, nil
}
