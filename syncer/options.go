package syncer

import (
	"log/slog"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of Options. Each is what a zero field means.
const (
	// DefaultBatchSize is how many records a worker reads and sends at once. A
	// thousand keeps a keyset scan near its best rate while a batch's documents
	// stay a few megabytes at most.
	DefaultBatchSize = 1000
	// DefaultBatchBytes bounds the keys and documents of one batch. A worker
	// holds two batches at once (it reads the next while it sends one), so
	// this keeps it near 32 MiB of documents whatever their sizes, while
	// batches of documents up to 16 KiB still fill their 1000 records.
	DefaultBatchBytes = 16 << 20
	// DefaultPollInterval is how long an idle worker waits for a wake-up before
	// it reads the feed anyway. Wake-ups carry the latency; the poll only covers
	// one lost to a reconnect, so it can be slow.
	DefaultPollInterval = 5 * time.Second
	// DefaultBackoffMin is the first wait after an infrastructure fault.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultBackoffMax caps the wait after repeated faults.
	DefaultBackoffMax = 30 * time.Second
	// DefaultLeaseRetry is how long a worker whose lease a rival holds waits
	// before it tries again (jittered). A standby worker costs one short
	// statement per retry.
	DefaultLeaseRetry = 5 * time.Second
	// DefaultMoveInterval is the longest a catching-up worker puts off moving
	// the cursor. At a few hundred batches a second, moving after each one
	// costs the database a durable commit per batch; a tenth of a second
	// between moves takes that to ten, and a lost lease then costs at most
	// that much resending.
	DefaultMoveInterval = 100 * time.Millisecond
	// DefaultProgressInterval is the least time between two progress lines of
	// a resync or a catch-up: often enough to follow a long one, rarely enough
	// that a catch-up of millions of rows logs a few dozen lines.
	DefaultProgressInterval = 10 * time.Second
	// DefaultAdvisorySinkTimeout bounds each sink call under a lease with no
	// margin to fit the call into (an advisory lock).
	DefaultAdvisorySinkTimeout = 30 * time.Second
	// DefaultStoreTimeout bounds each read and cursor move a worker asks of
	// its store: ample for a batch of DefaultBatchBytes over a slow link, and
	// far below the quarter of an hour a kernel may spend retransmitting to a
	// peer that no longer answers.
	DefaultStoreTimeout = 30 * time.Second
)

// Options configure a Worker or a Runner. The zero value is valid and means
// every default.
type Options struct {
	// BatchSize is the most records read and sent at once, 1 to
	// feed.MaxBatchLimit. It bounds the worker's memory whatever the feed's
	// size. Defaults to DefaultBatchSize.
	BatchSize int
	// BatchBytes bounds the bytes of keys and documents read and sent at
	// once (feed.BatchLimit.Bytes): a batch ends before the record that would
	// pass it, and holds one record alone when that one is larger. With
	// BatchSize it bounds the worker's memory, which holds two batches while
	// it reads one ahead, whatever the documents' sizes. At least 1.
	// Defaults to DefaultBatchBytes.
	BatchBytes int
	// PollInterval is how long an idle worker waits for a wake-up before it
	// reads the feed anyway. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// BackoffMin is the wait after a first infrastructure fault; each fault in
	// a row doubles it, up to BackoffMax, and each wait is jittered to between
	// half and all of it. Defaults to DefaultBackoffMin.
	BackoffMin time.Duration
	// BackoffMax caps the backoff; at least BackoffMin. Defaults to
	// DefaultBackoffMax, or BackoffMin when that is larger.
	BackoffMax time.Duration
	// LeaseRetry is how long a worker waits, jittered to between half and one
	// and a half times it, when a rival holds the lease. Defaults to
	// DefaultLeaseRetry.
	LeaseRetry time.Duration
	// SinkTimeout is the context deadline of every sink call. Sinks must
	// honour their context: the worker never abandons a call in flight, since
	// a call left running could land after the next one. Under a lease with a
	// margin (feed.Lease.Margin: lease rows), a call must end within it, so
	// that a call EnsureHeld let through lands before a rival can take the
	// lease: the deadline defaults to half the margin, and a SinkTimeout at or
	// above the margin of the lease the worker holds is cut to half of it, with
	// a warning. Under a lease without one (advisory locks) it defaults to
	// DefaultAdvisorySinkTimeout. The bound comes from the lease itself, so it
	// always matches how the store was configured.
	SinkTimeout time.Duration
	// StoreTimeout is the context deadline of each call a worker makes to its
	// store while it holds the lease: reading the cursor, the parked list and
	// the feed's batches (the read ahead included), and moving the cursor. A
	// request whose answer is lost on a connection TCP still thinks alive
	// would otherwise stall the worker until the kernel gave up on it, while
	// the store's other connections go on renewing the lease it does nothing
	// with; cut at the deadline, it is an infrastructure fault like any
	// other: the worker backs off, reads the cursor again and retries. A move
	// cut this way may still have landed; reading the cursor again finds out.
	// The take of the lease is not bounded here, since the context it gets is
	// the lease's lifetime. The deadline runs on the real clock, as a store's
	// client honours it. Defaults to DefaultStoreTimeout.
	StoreTimeout time.Duration
	// MoveInterval is how long a worker that is catching up may put off
	// moving the cursor. While each batch says more follows at once
	// (feed.Batch.More) and brings nothing to park or unpark, the worker
	// moves the cursor past it only when MoveInterval has passed since its
	// last move; the batch that ends a catch-up, a batch with park changes,
	// a resync's publish, a fault and the end of the lease all move it at
	// once, past every batch the sink took. The sink gets the same calls either way;
	// what changes is the cost to the store and what a lost lease costs: the
	// next holder sends again the batches whose move had not landed, as it
	// already does the one call in flight, and the sink's idempotence absorbs
	// them. Describe and tombstone collection see the cursor that landed. A
	// negative MoveInterval moves after every batch. Defaults to
	// DefaultMoveInterval.
	MoveInterval time.Duration
	// ProgressInterval is the least time, on Clock, between two INFO lines
	// reporting a resync's or a catch-up's progress (rows sent, rate, what is
	// left and when it should be done); Worker's doc says what else a worker
	// logs. Defaults to DefaultProgressInterval.
	ProgressInterval time.Duration
	// Clock is the time the worker's waits (poll, backoff, lease retry) run on
	// and its State is stamped with. A sink call's deadline is a context
	// deadline, on the real clock, since that is what a sink's client honours.
	// Defaults to feed.SystemClock.
	Clock feed.Clock
	// Logger receives the worker's faults and lease changes. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Observer, when set, hears of every sink call as it ends (metrics: the
	// calls' durations and failures by operation). Nil: nobody listens.
	Observer Observer
}

// Observer hears of a worker's sink calls. SinkCall runs on the worker's
// goroutine after each call, before the worker goes on, so it must return
// at once: count, observe, never block or call back into the worker.
type Observer interface {
	// SinkCall reports one call of op ("apply", "open resync", "apply
	// resync", "set resync floor", "publish", "abort resync") on the sink of
	// id: how long it took on the real clock (the one sink deadlines run
	// on), and the error it ended with, nil when it succeeded. Rejections
	// are a successful call's answer, not an error.
	SinkCall(id feed.SinkID, op string, took time.Duration, err error)
}

// resolve fills the defaults and validates the result, naming the field of
// anything wrong.
func (o Options) resolve() (Options, error) {
	const p = "syncer."
	switch {
	case o.BatchSize < 0 || o.BatchSize > feed.MaxBatchLimit:
		return o, feed.Invalid(p+"batch_size", "is %d; it must be 1 to %d (0 for the default %d)", o.BatchSize, feed.MaxBatchLimit, DefaultBatchSize)
	case o.BatchSize == 0:
		o.BatchSize = DefaultBatchSize
	}
	switch {
	case o.BatchBytes < 0:
		return o, feed.Invalid(p+"batch_bytes", "is %d; it must be at least 1 (0 for the default %d)", o.BatchBytes, DefaultBatchBytes)
	case o.BatchBytes == 0:
		o.BatchBytes = DefaultBatchBytes
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"poll_interval", &o.PollInterval, DefaultPollInterval},
		{"backoff_min", &o.BackoffMin, DefaultBackoffMin},
		{"lease_retry", &o.LeaseRetry, DefaultLeaseRetry},
		{"progress_interval", &o.ProgressInterval, DefaultProgressInterval},
		{"store_timeout", &o.StoreTimeout, DefaultStoreTimeout},
	} {
		if *d.v < 0 {
			return o, feed.Invalid(p+d.name, "is %v; durations must be positive", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	switch {
	case o.BackoffMax < 0:
		return o, feed.Invalid(p+"backoff_max", "is %v; durations must be positive", o.BackoffMax)
	case o.BackoffMax == 0:
		o.BackoffMax = max(DefaultBackoffMax, o.BackoffMin)
	case o.BackoffMax < o.BackoffMin:
		return o, feed.Invalid(p+"backoff_max", "(%v) must be at least backoff_min (%v)", o.BackoffMax, o.BackoffMin)
	}
	if o.MoveInterval == 0 {
		o.MoveInterval = DefaultMoveInterval // negative stays: a move after every batch
	}
	if o.SinkTimeout < 0 {
		return o, feed.Invalid(p+"sink_timeout", "is %v; durations must be positive", o.SinkTimeout)
	}
	if o.Clock == nil {
		o.Clock = feed.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
