package syncer

import (
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Phase is what a worker is doing; the Worker's doc has the state machine.
type Phase string

const (
	// PhaseStarting: Run has not begun yet.
	PhaseStarting Phase = "starting"
	// PhaseAcquiring: taking the lease.
	PhaseAcquiring Phase = "acquiring"
	// PhaseStandby: a rival holds the lease; waiting to try again.
	PhaseStandby Phase = "standby"
	// PhaseResyncing: filling a fresh copy of the sink from the start of the
	// feed's current generation.
	PhaseResyncing Phase = "resyncing"
	// PhaseSending: sending incremental batches after the cursor.
	PhaseSending Phase = "sending"
	// PhaseIdle: caught up; waiting for a wake-up or the poll interval.
	PhaseIdle Phase = "idle"
	// PhaseBackoff: waiting after an infrastructure fault before trying again.
	PhaseBackoff Phase = "backoff"
	// PhaseStopped: Run returned and the lease was released.
	PhaseStopped Phase = "stopped"
)

// State is a snapshot of one worker, for the command line, metrics and
// dashboards. Figures come from the worker's own view, not from the store: they
// are as of the worker's last read or move.
type State struct {
	ID    feed.SinkID
	Phase Phase
	// LeaseHeld says whether the worker holds the lease now; Holder is that
	// lease's id ("" when none).
	LeaseHeld bool
	Holder    feed.LeaseHolder
	// Cursor is where the sink stands, as last read or moved by this worker.
	Cursor feed.Cursor
	// Head is the feed's head at the worker's last read.
	Head feed.Seq
	// Lag is Head minus the cursor's seq when the last read filled a whole
	// batch, and 0 when it found the worker caught up. It counts seqs, an upper
	// bound on the records still to send, since compaction leaves gaps.
	Lag int64
	// RecordsSent counts records handed to the sink, resends after a fault
	// included.
	RecordsSent int64
	// Resyncs counts resyncs published.
	Resyncs int64
	// Parked is the number of keys parked for the sink, as far as the worker
	// knows (read at each lease, then kept in step with its own moves).
	Parked int
	// LastAdvance is when this worker last moved the cursor; zero if never.
	LastAdvance time.Time
	// WakeUps says whether the worker holds a subscription to the feed's
	// wake-ups now. Without one it still sends everything, on its poll
	// (Options.PollInterval), and tries to subscribe again each poll.
	// WakeUpError is why the last try failed, nil once one succeeded: a
	// wake-up source that is down shows here as well as in LastError, which
	// a later fault replaces.
	WakeUps     bool
	WakeUpError error
	// LastError is the last fault the worker met, nil until then; it stays
	// after recovery, with LastErrorAt, so a flapping worker shows.
	LastError   error
	LastErrorAt time.Time
}
