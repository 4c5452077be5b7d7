package memfeed

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// await waits until ok holds for fs and returns with s.mu held; ok is
// checked with s.mu held, and again after every release of a lock of fs
// (broadcast). On ctx's end it returns a feed.WriteFailed naming what, with
// s.mu not held.
func (s *Store) await(ctx context.Context, fs *feedState, ok func() bool, what string) error {
	s.mu.Lock()
	for !ok() {
		ch := fs.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return feed.WriteFailed(what, ctx.Err())
		}
		s.mu.Lock()
	}
	return nil
}

// broadcast wakes every waiter of await on fs. s.mu must be held.
func (fs *feedState) broadcast() {
	close(fs.changed)
	fs.changed = make(chan struct{})
}

// writeUnsealed stages a concurrent-mode write: each key's lock (waiting
// while another open writer holds it, as pgfeed's row lock), then its value
// beside the key's sealed row at commit. tx.mu is held.
func (tx *Tx) writeUnsealed(ctx context.Context, tf *txFeed, changes []feed.Change) (feed.WriteResult, error) {
	s, fs := tx.s, tf.fs
	res := feed.WriteResult{Generation: tf.generation, Unsealed: make([]feed.Key, 0, len(changes))}
	for _, c := range changes {
		if err := s.await(ctx, fs, func() bool {
			h := fs.holders[c.Key]
			return h == nil || h == tx
		}, "waiting for key "+string(c.Key)+" of feed "+fs.name); err != nil {
			return feed.WriteResult{}, err
		}
		if fs.holders[c.Key] == nil {
			fs.holders[c.Key] = tx
			tf.held = append(tf.held, c.Key)
		}
		s.mu.Unlock()
		tf.staged[c.Key] = clone(c.Doc)
		res.Unsealed = append(res.Unsealed, c.Key)
	}
	return res, nil
}

// SetWriteMode moves f to mode, as pgfeed.Store.SetWriteMode does and with
// its errors: it takes the feed's write lock exclusive (waiting for every
// open writer of either mode and holding back new ones) and the feed lock,
// and moving to the locked mode first seals every unsealed value, so the
// locked mode never meets one. The mode is kept in the feed's state; a
// transaction that joined the feed before keeps the mode it joined in,
// which the write lock makes impossible to tell apart.
func (s *Store) SetWriteMode(ctx context.Context, f feed.FeedName, mode feed.WriteMode) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if err := mode.Validate("mode"); err != nil {
		return err
	}
	tx := s.Begin()
	defer tx.Rollback()
	tx.mu.Lock()
	tf, err := tx.join(ctx, f, true)
	tx.mu.Unlock()
	if err != nil {
		return feed.WriteFailed("setting the write mode of feed "+string(f), err)
	}
	s.mu.Lock()
	fs := tf.fs
	if mode == feed.WriteLocked {
		// Every writer has ended (the exclusive write lock), so no key is
		// held and one round seals all.
		s.sealLocked(fs, nil)
	}
	fs.mode = mode
	fs.recorded = true // pgfeed records the generations row
	s.mu.Unlock()
	return nil
}

// SealRound runs one sealing round on f and returns how many keys it sealed:
// under the feed lock, every unsealed value whose key no open writer holds
// goes to its key's row at fresh seqs above the head, in key order, and
// the feed's subscribers are woken once. It is memfeed's round of pgfeed's
// sealer, unbounded (memfeed has no lock hold to keep short); a held key is
// skipped and sealed by a later round with its writer's value, once that
// writer commits. RunSealer runs rounds; tests call it to seal at a point
// of their choosing.
func (s *Store) SealRound(ctx context.Context, f feed.FeedName) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	fs, err := s.lockFeed(ctx, f)
	if err != nil {
		return 0, feed.WriteFailed("sealing feed "+string(f), err)
	}
	defer s.unlockFeed(fs)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sealLocked(fs, fs.holders), nil
}

// sealLocked seals fs's unsealed values whose keys are not in held. The
// feed lock and s.mu must be held.
func (s *Store) sealLocked(fs *feedState, held map[feed.Key]*Tx) int {
	n := 0
	for _, k := range slices.Sorted(maps.Keys(fs.pending)) {
		if held[k] != nil {
			continue
		}
		fs.head++
		fs.put(k, row{seq: fs.head, doc: fs.pending[k]})
		delete(fs.pending, k)
		n++
	}
	if n > 0 {
		fs.recorded = true
		fs.wake()
	}
	return n
}

// RunSealer seals f's unsealed values until ctx ends, while f is in the
// concurrent mode and this caller holds the feed's sealer lease (one holder
// at a time, timed like a sink's lease, Options.Lease), as pgfeed's
// RunSealer does; syncer.Runner runs it for every feed of its targets. It
// needs no poll: every end of a writer's transaction wakes it, and it
// renews the lease at every wake and at least every heartbeat. It returns
// nil when ctx ends.
func (s *Store) RunSealer(ctx context.Context, f feed.FeedName) error {
	if err := f.Validate(); err != nil {
		return err
	}
	holder := feed.LeaseHolder("mem-sealer:" + string(newHolder()))
	s.mu.Lock()
	fs := s.feedLocked(f)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if fs.sealer == holder {
			fs.sealer, fs.sealerExpires = "", time.Time{}
		}
		s.mu.Unlock()
	}()
	for ctx.Err() == nil {
		s.mu.Lock()
		ch := fs.changed
		now := s.clock.Now()
		mine := false
		if fs.mode == feed.WriteConcurrent {
			if fs.sealer == holder || fs.sealer == "" || !fs.sealerExpires.After(now) {
				fs.sealer, fs.sealerExpires = holder, now.Add(s.lease.TTL)
				mine = true
			}
		} else if fs.sealer == holder {
			fs.sealer, fs.sealerExpires = "", time.Time{}
		}
		pending := len(fs.pending) > 0
		s.mu.Unlock()
		if mine && pending {
			if _, err := s.SealRound(ctx, f); err != nil {
				return nil // only ctx ends a round early
			}
		}
		t := time.NewTimer(s.lease.Heartbeat)
		select {
		case <-ctx.Done():
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// SealedRange says where a concurrent-mode write of keys stands, for
// read-your-writes (syncer.WaitApplied), as pgfeed's does: sealed is false
// while any key has an unsealed value; once none has, first and last are
// the lowest and highest seq of the keys' rows and gen the feed's
// generation. A key with no row plays no part.
func (s *Store) SealedRange(_ context.Context, f feed.FeedName, keys []feed.Key) (gen feed.Generation, first, last feed.Seq, sealed bool, err error) {
	if err := f.Validate(); err != nil {
		return 0, 0, 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	for _, k := range keys {
		if _, ok := fs.pending[k]; ok {
			return fs.generation, 0, 0, false, nil
		}
	}
	for _, k := range keys {
		if r, ok := fs.rows[k]; ok {
			if first == 0 || r.seq < first {
				first = r.seq
			}
			last = max(last, r.seq)
		}
	}
	return fs.generation, first, last, true, nil
}
