package syncer

import (
	"fmt"
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
	// DefaultAdvisorySinkTimeout bounds each sink call under the advisory-lock
	// kind, whose lease has no margin to fit the call into.
	DefaultAdvisorySinkTimeout = 30 * time.Second
)

// LeaseKind is the kind of lease the SyncStore hands out. The store decides
// the kind; the worker needs to know it only to bound its sink calls.
type LeaseKind int

const (
	// LeaseRow is a holder and an expiry on the cursor row, renewed by a
	// heartbeat (feed.LeaseOptions). A sink call must fit in the lease's margin,
	// so SinkTimeout defaults to half of it and may not reach it.
	LeaseRow LeaseKind = iota
	// AdvisoryLock is a session lock on a reserved connection. It has no margin:
	// EnsureHeld asks the session, and a call it let through is stale only if
	// the session dies during it.
	AdvisoryLock
)

func (k LeaseKind) String() string {
	switch k {
	case LeaseRow:
		return "lease-row"
	case AdvisoryLock:
		return "advisory-lock"
	}
	return fmt.Sprintf("LeaseKind(%d)", int(k))
}

// Options configure a Worker or a Runner. The zero value is valid and means
// every default.
type Options struct {
	// BatchSize is the most records read and sent at once, 1 to
	// feed.MaxBatchLimit. It bounds the worker's memory whatever the feed's
	// size. Defaults to DefaultBatchSize.
	BatchSize int
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
	// LeaseKind is the kind of lease the store hands out. Defaults to LeaseRow.
	LeaseKind LeaseKind
	// Lease holds the lease-row timings the store was built with (the store
	// does not say); only the margin matters here, as the bound SinkTimeout
	// must stay under. Ignored under AdvisoryLock. Zero fields take the
	// defaults of feed.LeaseOptions.
	Lease feed.LeaseOptions
	// SinkTimeout is the context deadline of every sink call. Under LeaseRow
	// it must be shorter than the lease margin, so that a call EnsureHeld let
	// through is cut before a rival can take the lease. Sinks must honour their
	// context: the worker never abandons a call in flight, since a call left
	// running could land after the next one. Defaults to half the margin under
	// LeaseRow, DefaultAdvisorySinkTimeout under AdvisoryLock.
	SinkTimeout time.Duration
	// Clock is the time the worker's waits (poll, backoff, lease retry) run on
	// and its State is stamped with. A sink call's deadline is a context
	// deadline, on the real clock, since that is what a sink's client honours.
	// Defaults to feed.SystemClock.
	Clock feed.Clock
	// Logger receives the worker's faults and lease changes. Defaults to
	// slog.Default().
	Logger *slog.Logger
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
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"poll_interval", &o.PollInterval, DefaultPollInterval},
		{"backoff_min", &o.BackoffMin, DefaultBackoffMin},
		{"lease_retry", &o.LeaseRetry, DefaultLeaseRetry},
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
	if o.SinkTimeout < 0 {
		return o, feed.Invalid(p+"sink_timeout", "is %v; durations must be positive", o.SinkTimeout)
	}
	switch o.LeaseKind {
	case LeaseRow:
		lease, err := o.Lease.Resolve(p + "lease")
		if err != nil {
			return o, err
		}
		o.Lease = lease
		if o.SinkTimeout == 0 {
			o.SinkTimeout = lease.Margin / 2
		}
		if o.SinkTimeout >= lease.Margin {
			return o, feed.Invalid(p+"sink_timeout", "(%v) must be shorter than the lease margin (%v), or a sink call could land after a rival took the lease", o.SinkTimeout, lease.Margin)
		}
	case AdvisoryLock:
		if o.SinkTimeout == 0 {
			o.SinkTimeout = DefaultAdvisorySinkTimeout
		}
	default:
		return o, feed.Invalid(p+"lease_kind", "is %v; it must be LeaseRow or AdvisoryLock", o.LeaseKind)
	}
	if o.Clock == nil {
		o.Clock = feed.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
