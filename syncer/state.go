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
	// WaitingFor is, while the worker waits for the lease (standby, and the
	// retries in between), the holder the store named when it last refused
	// the worker, and WaitingUntil when that holder's lease lapses unless it
	// renews it: the latest a crashed holder keeps the sink. WaitingUntil is
	// zero for an advisory holder, which keeps the sink as long as its
	// session lives. Both are zero once the worker takes the lease, and when
	// the store did not say.
	WaitingFor   feed.LeaseHolder
	WaitingUntil time.Time
	// Cursor is where the sink stands, as last read or moved by this worker.
	Cursor feed.Cursor
	// Head is the feed's head at the worker's last read.
	Head feed.Seq
	// Lag is Head minus the cursor's seq when the last read filled a whole
	// batch, and 0 when it found the worker caught up. It counts seqs, an upper
	// bound on the records still to send, since compaction leaves gaps.
	Lag int64
	// RecordsSent counts the records handed to the sink in calls that
	// change it (applies, to the live copy or to a resync target), whatever
	// became of them: records the sink refused, calls that failed and the
	// resends after a fault or a lease change all count. It measures the load
	// on the sink, not progress.
	RecordsSent int64
	// RecordsApplied counts progress: the records (a key at a seq) that the
	// sink took without refusing them and that a cursor move of this worker
	// then landed past, each once. A batch whose move is put off
	// (Options.MoveInterval) counts when the move that covers it lands, and
	// not at all when none does (its records are sent again, and count
	// then); a resync's records count when the move after its publish lands.
	// A move that landed but whose answer was lost counts nothing.
	RecordsApplied int64
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
	// LastError is the last fault the worker met, nil until then, and
	// LastErrorAt when it met it. It stays after the worker recovered, so
	// that a flapping worker shows; RecoveredAt says whether it did.
	LastError   error
	LastErrorAt time.Time
	// RecoveredAt is when the worker next got something done after
	// LastError: a step of work that succeeded, or a lease taken. Zero while
	// the fault stands (and before any fault), so LastError != nil with a
	// zero RecoveredAt is a worker failing now. A fault that does not stop
	// the work (a failed subscription, after which the worker polls) is
	// recovered from as soon as the step it happened in succeeds.
	RecoveredAt time.Time
}
