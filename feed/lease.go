package feed

import (
	"fmt"
	"time"
)

// Lease-row defaults. The heartbeat is a fifth of the ttl and the margin a
// third, so 3×heartbeat + margin < ttl: a worker keeps sending through one
// renewal that fails or hangs, with no failed EnsureHeld (LeaseOptions has the
// arithmetic).
const (
	DefaultLeaseTTL       = 30 * time.Second
	DefaultLeaseHeartbeat = 6 * time.Second
)

// LeaseOptions are the timings of a lease-row lease: the holder and an expiry
// on the sink's cursor row, renewed by a heartbeat.
//
// # Why EnsureHeld fails a margin early
//
// EnsureHeld fails once the last renewal that landed STARTED ttl − margin ago,
// by the worker's monotonic clock. That renewal's stored expiry, the earliest a
// rival may take the row, is then at most margin away. So a sink call that
// EnsureHeld let through and that lands within margin of the check (pauses
// included) lands before any rival can hold the lease, however the renewals have
// been failing meanwhile. A call that outlasts the margin (a slow sink, a GC
// pause, a network stall) may land after a rival took over: ONE stale call,
// since the next EnsureHeld fails. That is the "at most one stale call per lost
// lease" of guarantee 3, and why sinks that can should make writes conditional
// on seq.
//
// # Why heartbeat + margin < ttl
//
// Each renewal is bounded by the heartbeat and the next starts on the next tick
// of a fixed cadence, whatever became of the one before; the age EnsureHeld
// judges runs from when a renewal started. So with every renewal landing the
// worst age EnsureHeld meets is heartbeat plus the renewal's latency, and with
// one renewal lost, 2×heartbeat plus it. A worker therefore sends without a
// single failed EnsureHeld through slow renewals when 2×heartbeat + margin ≤ ttl,
// and through one failed or hanging renewal when 3×heartbeat + margin ≤ ttl,
// which the defaults satisfy. Validation enforces only heartbeat + margin < ttl
// (the zero-latency form of the first), so a tighter configuration is accepted
// and trades those tolerances for a shorter ttl.
type LeaseOptions struct {
	// TTL is how long a lease lasts without a renewal. Defaults to
	// DefaultLeaseTTL.
	TTL time.Duration
	// Heartbeat is how often the holder renews; shorter than TTL. Defaults to
	// DefaultLeaseHeartbeat, or TTL/5 when TTL is set and Heartbeat is not.
	Heartbeat time.Duration
	// Margin is how long before the stored expiry EnsureHeld starts failing: a
	// sink call shorter than this cannot land after a rival took the lease.
	// Defaults to TTL/3.
	Margin time.Duration
}

// Resolve fills the defaults and validates the result: every duration positive,
// heartbeat < ttl, heartbeat + margin < ttl. A zero field means its default; a
// negative one, or one that resolves to zero, is refused. field prefixes the
// names in errors ("lease" gives "lease.heartbeat").
func (o LeaseOptions) Resolve(field string) (LeaseOptions, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ttl", o.TTL}, {"heartbeat", o.Heartbeat}, {"margin", o.Margin}} {
		if d.v < 0 {
			return o, Invalid(field+"."+d.name, "is %v; durations must be positive", d.v)
		}
	}
	if o.TTL == 0 {
		o.TTL = DefaultLeaseTTL
		if o.Heartbeat == 0 {
			o.Heartbeat = DefaultLeaseHeartbeat
		}
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = o.TTL / 5
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / 3
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat", o.Heartbeat}, {"margin", o.Margin}} {
		if d.v <= 0 {
			return o, Invalid(field+"."+d.name, "resolves to %v from ttl %v; durations must be positive", d.v, o.TTL)
		}
	}
	if o.Heartbeat >= o.TTL {
		return o, Invalid(field+".heartbeat", "(%v) must be shorter than ttl (%v), or the lease lapses between renewals", o.Heartbeat, o.TTL)
	}
	if o.Heartbeat+o.Margin >= o.TTL {
		return o, Invalid(field+".margin", "heartbeat (%v) + margin (%v) must be shorter than ttl (%v), or EnsureHeld fails between two renewals that both landed", o.Heartbeat, o.Margin, o.TTL)
	}
	return o, nil
}

// Usable is how long after a renewal started EnsureHeld keeps passing:
// ttl − margin.
func (o LeaseOptions) Usable() time.Duration { return o.TTL - o.Margin }

func (o LeaseOptions) String() string {
	return fmt.Sprintf("ttl=%v heartbeat=%v margin=%v", o.TTL, o.Heartbeat, o.Margin)
}
