package memfeed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Options configure a Store. The zero value is valid and means all defaults.
type Options struct {
	// Lease holds the lease-row timings. Zero fields take the defaults of
	// feed.LeaseOptions.
	Lease feed.LeaseOptions
	// Clock is the time the store stamps and compares with, and its leases'
	// timers run on. Defaults to feed.SystemClock.
	Clock feed.Clock
	// Logger receives lease renewal failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// Store is an in-memory feed and sync store for any number of feeds. It
// implements feed.Writer[*Tx], feed.Reader, feed.SyncStore and
// feed.CursorWatcher, and is safe for concurrent use. One mutex guards all
// state; every operation holds it for its whole length, which is what makes
// each one atomic and the whole store easy to check by reading.
type Store struct {
	lease  feed.LeaseOptions
	clock  feed.Clock
	logger *slog.Logger
	faults faultSet

	mu    sync.Mutex
	feeds map[feed.FeedName]*feedState
}

// feedState is one feed: its rows, its sinks and its lock.
type feedState struct {
	name string
	// recorded says the feed's generation and head are recorded, as a
	// committed write or reset records them (pgfeed's generations row):
	// with a registered sink, what makes the feed known to Describe.
	recorded   bool
	generation feed.Generation
	head       feed.Seq // highest seq of a committed row
	rows       map[feed.Key]row
	// order lists seqs ascending; bySeq says which key a seq still belongs to.
	// An update or restamp leaves its old seq in order, stale, skipped on read
	// and swept out once stale entries are the majority.
	order []feed.Seq
	bySeq map[feed.Seq]feed.Key

	// lock is the feed lock: a writer's transaction takes it on its first
	// write and holds it to commit or rollback, so seqs are handed out in
	// commit order. It is a channel so that waiting for it honours a context.
	lock  chan struct{}
	subs  map[*subscription]struct{}
	sinks map[feed.SinkName]*sinkState
	// cursorSubs are woken by every cursor move that lands (CursorWatcher).
	cursorSubs map[*subscription]struct{}

	// The concurrent write mode (concurrent.go). mode is the feed's write
	// mode, "" meaning the locked one. pending holds the committed unsealed
	// value of each key written in the concurrent mode, beside its sealed
	// row: pgfeed's pending_doc, one value per key, the latest committed.
	mode    feed.WriteMode
	pending map[feed.Key][]byte // value nil: a tombstone
	// The write lock, shared by every open writer (sharers) and taken
	// exclusive (excl) by a reset or a mode change, which so wait for every
	// open writer; and the key locks of open concurrent-mode writers
	// (holders), which make a second writer of a key wait and a sealing
	// round skip the key. changed is closed and replaced whenever any of
	// them is released, waking whoever waits for one.
	sharers map[*Tx]struct{}
	excl    *Tx
	holders map[feed.Key]*Tx
	changed chan struct{}
	// The sealer's lease (RunSealer).
	sealer        feed.LeaseHolder
	sealerExpires time.Time
}

type row struct {
	seq feed.Seq
	doc []byte // nil: tombstone
}

type sinkState struct {
	cursor      feed.Cursor
	lastAdvance time.Time
	holder      feed.LeaseHolder
	expires     time.Time
	parked      map[feed.Key]feed.ParkedRecord
}

// New returns an empty store, or an *feed.InvalidError for bad options.
func New(opts Options) (*Store, error) {
	lease, err := opts.Lease.Resolve("lease")
	if err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = feed.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Store{
		lease:  lease,
		clock:  opts.Clock,
		logger: opts.Logger,
		feeds:  make(map[feed.FeedName]*feedState),
	}, nil
}

// feedLocked returns the state of f, creating an empty one: a feed that was
// never written reads as empty at generation 1. s.mu must be held.
func (s *Store) feedLocked(f feed.FeedName) *feedState {
	fs := s.feeds[f]
	if fs == nil {
		fs = &feedState{
			name:       string(f),
			generation: feed.FirstGeneration,
			rows:       make(map[feed.Key]row),
			bySeq:      make(map[feed.Seq]feed.Key),
			lock:       make(chan struct{}, 1),
			subs:       make(map[*subscription]struct{}),
			sinks:      make(map[feed.SinkName]*sinkState),
			cursorSubs: make(map[*subscription]struct{}),
			pending:    make(map[feed.Key][]byte),
			sharers:    make(map[*Tx]struct{}),
			holders:    make(map[feed.Key]*Tx),
			changed:    make(chan struct{}),
		}
		s.feeds[f] = fs
	}
	return fs
}

// lockFeed takes f's feed lock, waiting while another transaction holds it.
func (s *Store) lockFeed(ctx context.Context, f feed.FeedName) (*feedState, error) {
	s.mu.Lock()
	fs := s.feedLocked(f)
	s.mu.Unlock()
	if s.faults.writeSkipsFeedLock {
		return fs, nil
	}
	select {
	case fs.lock <- struct{}{}:
		return fs, nil
	case <-ctx.Done():
		return nil, feed.WriteFailed("waiting for the lock of feed "+string(f), ctx.Err())
	}
}

func (s *Store) unlockFeed(fs *feedState) {
	if s.faults.writeSkipsFeedLock {
		return
	}
	<-fs.lock
}

// put stores r for key, at a seq above every other. s.mu must be held.
func (fs *feedState) put(key feed.Key, r row) {
	if old, ok := fs.rows[key]; ok {
		delete(fs.bySeq, old.seq)
	}
	fs.rows[key] = r
	fs.bySeq[r.seq] = key
	fs.order = append(fs.order, r.seq)
	if len(fs.order) > 64 && len(fs.order) > 2*len(fs.rows) {
		fs.order = slices.DeleteFunc(fs.order, func(q feed.Seq) bool { _, ok := fs.bySeq[q]; return !ok })
	}
}

// remove deletes key's row outright (collection), its unsealed value with
// it, as deleting pgfeed's row deletes its pending_doc. s.mu must be held.
func (fs *feedState) remove(key feed.Key) {
	if old, ok := fs.rows[key]; ok {
		delete(fs.bySeq, old.seq)
		delete(fs.rows, key)
	}
	delete(fs.pending, key)
}

func (fs *feedState) wake() {
	for sub := range fs.subs {
		sub.signal()
	}
}

func (fs *feedState) wakeCursors() {
	for sub := range fs.cursorSubs {
		sub.signal()
	}
}

// Tx is an in-memory transaction: the writes a caller stages with Write become
// visible together at Commit, or not at all. Like a database transaction it
// holds the lock of every feed it wrote until it ends, so always end it.
type Tx struct {
	s      *Store
	mu     sync.Mutex
	done   bool
	locked map[feed.FeedName]*txFeed
	order  []feed.FeedName
}

// txFeed is what a transaction has staged for one feed.
type txFeed struct {
	fs         *feedState
	generation feed.Generation // as the transaction sees it
	head       feed.Seq        // ditto
	reset      bool            // the rows before the transaction are gone
	writes     []row
	keys       []feed.Key
	// concurrent says the feed was in the concurrent mode when the
	// transaction joined it: its writes go to unsealed (staged) under key
	// locks (held), without the feed lock (locked false).
	concurrent bool
	staged     map[feed.Key][]byte
	held       []feed.Key
	locked     bool // the feed lock is held
	exclusive  bool // the write lock is held exclusive (a reset)
}

// Begin starts a transaction.
func (s *Store) Begin() *Tx {
	return &Tx{s: s, locked: make(map[feed.FeedName]*txFeed)}
}

// join takes f's write lock for tx on its first use, shared, or exclusive
// for a reset (upgrading a shared one), and then the feed lock unless the
// feed is in the concurrent mode and tx only writes: the order pgfeed takes
// its advisory write lock and its generations row in.
func (tx *Tx) join(ctx context.Context, f feed.FeedName, reset bool) (*txFeed, error) {
	if tx.done {
		return nil, feed.Invalid("tx", "the transaction has already ended")
	}
	s := tx.s
	tf := tx.locked[f]
	if tf == nil {
		s.mu.Lock()
		fs := s.feedLocked(f)
		s.mu.Unlock()
		err := s.await(ctx, fs, func() bool { return fs.excl == nil || fs.excl == tx }, "waiting for the write lock of feed "+string(f))
		if err != nil {
			return nil, err
		}
		fs.sharers[tx] = struct{}{}
		tf = &txFeed{fs: fs, concurrent: fs.mode == feed.WriteConcurrent, staged: make(map[feed.Key][]byte)}
		s.mu.Unlock()
		tx.locked[f] = tf
		tx.order = append(tx.order, f)
	}
	fs := tf.fs
	if reset && !tf.exclusive {
		err := s.await(ctx, fs, func() bool {
			_, mine := fs.sharers[tx]
			return (fs.excl == nil || fs.excl == tx) && len(fs.sharers) == 1 && mine
		}, "waiting for the open writers of feed "+string(f))
		if err != nil {
			return nil, err
		}
		fs.excl = tx
		tf.exclusive = true
		s.mu.Unlock()
	}
	if !tf.locked && (reset || !tf.concurrent) {
		if _, err := s.lockFeed(ctx, f); err != nil {
			return nil, err
		}
		tf.locked = true
		s.mu.Lock()
		tf.generation, tf.head = fs.generation, fs.head
		s.mu.Unlock()
	} else if !tf.locked && tf.generation == 0 {
		s.mu.Lock()
		tf.generation, tf.head = fs.generation, fs.head
		s.mu.Unlock()
	}
	return tf, nil
}

// Write stages changes to f in tx; see feed.Writer.
func (s *Store) Write(ctx context.Context, tx *Tx, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
	if tx == nil || tx.s != s {
		return feed.WriteResult{}, feed.Invalid("tx", "is not a transaction of this store")
	}
	if err := f.Validate(); err != nil {
		return feed.WriteResult{}, err
	}
	changes, err := feed.PrepareChanges(changes)
	if err != nil || len(changes) == 0 {
		return feed.WriteResult{}, err
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tf, err := tx.join(ctx, f, false)
	if err != nil {
		return feed.WriteResult{}, err
	}
	if tf.concurrent {
		return tx.writeUnsealed(ctx, tf, changes)
	}
	res := feed.WriteResult{Generation: tf.generation, First: tf.head + 1}
	for _, c := range changes {
		tf.head++
		tf.writes = append(tf.writes, row{seq: tf.head, doc: clone(c.Doc)})
		tf.keys = append(tf.keys, c.Key)
	}
	res.Last = tf.head
	return res, nil
}

// WriteCommitted writes changes to f in a transaction of their own.
func (s *Store) WriteCommitted(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
	tx := s.Begin()
	defer tx.Rollback()
	res, err := s.Write(ctx, tx, f, changes)
	if err != nil {
		return res, err
	}
	return res, tx.Commit()
}

// ResetFeed stages a rebuild's feed half in tx: under the feed lock, the
// generation moves on and every row of the feed goes, at commit. Seqs are not
// reset, so rows written after it are above every cursor of the old generation.
// It first takes the feed's write lock exclusive, so it waits for every open
// writer of either mode (pgfeed's ResetTx does the same): every value a
// writer committed before it, unsealed ones included, belongs to the old
// generation and goes with it, and no unsealed value of the old generation
// is ever sealed into the new one. A writer that comes after waits for the
// reset's end and writes into the new generation.
func (tx *Tx) ResetFeed(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tf, err := tx.join(ctx, f, true)
	if err != nil {
		return 0, err
	}
	tf.generation++
	tf.reset = true
	tf.writes, tf.keys = nil, nil
	clear(tf.staged)
	return tf.generation, nil
}

// Commit makes the staged writes visible at once, wakes the feeds'
// subscribers and releases the feed locks.
func (tx *Tx) Commit() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return feed.Invalid("tx", "the transaction has already ended")
	}
	tx.done = true
	s := tx.s
	s.mu.Lock()
	for _, f := range tx.order {
		tf := tx.locked[f]
		fs := tf.fs
		if tf.reset {
			fs.rows = make(map[feed.Key]row)
			fs.bySeq = make(map[feed.Seq]feed.Key)
			fs.order = nil
			if !s.faults.resetKeepsUnsealed {
				clear(fs.pending)
			}
			fs.generation = tf.generation
		}
		for i, r := range tf.writes {
			fs.put(tf.keys[i], r)
		}
		for k, d := range tf.staged {
			fs.pending[k] = d
		}
		if tf.head > fs.head {
			fs.head = tf.head
		}
		if len(tf.staged) > 0 {
			fs.recorded = true // no wake-up: a concurrent write notifies nobody
		}
		if len(tf.writes) > 0 || tf.reset {
			fs.recorded = true
			fs.wake()
		}
	}
	s.mu.Unlock()
	tx.release()
	return nil
}

// Rollback drops the staged writes and releases the feed locks. It is safe to
// call after Commit, which makes it a fit for defer.
func (tx *Tx) Rollback() {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return
	}
	tx.done = true
	tx.release()
}

func (tx *Tx) release() {
	s := tx.s
	for _, f := range tx.order {
		tf := tx.locked[f]
		if tf.locked {
			s.unlockFeed(tf.fs)
		}
		s.mu.Lock()
		fs := tf.fs
		delete(fs.sharers, tx)
		if fs.excl == tx {
			fs.excl = nil
		}
		for _, k := range tf.held {
			if fs.holders[k] == tx {
				delete(fs.holders, k)
			}
		}
		fs.broadcast()
		s.mu.Unlock()
	}
	tx.locked, tx.order = nil, nil
}

// Head returns f's head; see feed.Reader.
func (s *Store) Head(_ context.Context, f feed.FeedName) (feed.Seq, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.feedLocked(f).head, nil
}

// Generation returns f's generation; see feed.Reader.
func (s *Store) Generation(_ context.Context, f feed.FeedName) (feed.Generation, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.feedLocked(f).generation, nil
}

// ReadBatch returns the records after seq after, up to limit; see
// feed.Reader.
func (s *Store) ReadBatch(_ context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	if err := f.Validate(); err != nil {
		return feed.Batch{}, err
	}
	if after < 0 {
		return feed.Batch{}, feed.Invalid("after", "is %d; seqs are never negative", after)
	}
	if err := limit.Validate("limit"); err != nil {
		return feed.Batch{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	b := feed.Batch{Generation: fs.generation, Head: fs.head}
	if s.faults.readSkipsGeneration {
		b.Generation = feed.FirstGeneration
	}
	size := 0
	for i := sort.Search(len(fs.order), func(i int) bool { return fs.order[i] > after }); i < len(fs.order); i++ {
		key, ok := fs.bySeq[fs.order[i]]
		if !ok {
			continue
		}
		if len(b.Records) == limit.Records {
			b.More = true
			break
		}
		r := fs.rows[key]
		if size += len(key) + len(r.doc); limit.Bytes > 0 && size > limit.Bytes && len(b.Records) > 0 {
			b.More = true
			break
		}
		b.Records = append(b.Records, feed.Record{Key: key, Seq: r.seq, Doc: clone(r.doc)})
	}
	return b, nil
}

// Subscribe returns a subscription signalled after every commit to f.
func (s *Store) Subscribe(_ context.Context, f feed.FeedName) (feed.Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	sub := &subscription{c: make(chan struct{}, 1), s: s, set: fs.subs}
	sub.set[sub] = struct{}{}
	return sub, nil
}

// SubscribeCursors returns a subscription signalled after every cursor move
// of a sink of f that lands; see feed.CursorWatcher. Only this store's own
// moves wake it: memfeed shares nothing across stores.
func (s *Store) SubscribeCursors(_ context.Context, f feed.FeedName) (feed.Subscription, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.feedLocked(f)
	sub := &subscription{c: make(chan struct{}, 1), s: s, set: fs.cursorSubs}
	sub.set[sub] = struct{}{}
	return sub, nil
}

type subscription struct {
	c   chan struct{}
	s   *Store
	set map[*subscription]struct{} // the feed's set it is in
}

func (sub *subscription) C() <-chan struct{} { return sub.c }

func (sub *subscription) signal() {
	select {
	case sub.c <- struct{}{}:
	default: // a signal is already waiting: wake-ups coalesce
	}
}

func (sub *subscription) Close() {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	delete(sub.set, sub)
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// newHolder returns a fresh random lease holder id.
func newHolder() feed.LeaseHolder {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return feed.LeaseHolder("mem-row:" + hex.EncodeToString(b[:]))
}
