package feed

import (
	"errors"
	"fmt"
	"time"
)

// Sentinels for the conditions a caller branches on. Every error this module
// returns for one of these conditions matches its sentinel with errors.Is, and
// its typed form (below) with errors.As when the caller needs the details.
var (
	// ErrLeaseHeld: another worker holds the lease of this feed and sink now.
	// The driver waits and tries again; an operator's RemoveSink refuses.
	ErrLeaseHeld = errors.New("lease held by another worker")

	// ErrLeaseLost: the lease this worker took is gone (released, lapsed, taken
	// over, or its session died). The worker must stop sending at once.
	ErrLeaseLost = errors.New("lease lost")

	// ErrCursorSuperseded: a cursor compare-and-set lost its guard, because the
	// caller no longer holds the lease or the cursor is not where it expected.
	// Nothing the move carried (cursor or parked list) was written.
	ErrCursorSuperseded = errors.New("cursor superseded")

	// ErrUnreadable: a read of the feed or its sync state failed for a reason of
	// the infrastructure (connection, timeout, server). Retrying later may work.
	ErrUnreadable = errors.New("feed unreadable")

	// ErrWriteFailed: a write to the feed or its sync state failed for a reason
	// of the infrastructure. It did not land. Retrying later may work.
	ErrWriteFailed = errors.New("feed write failed")

	// ErrUnknownFeed: an operator asked about a feed the store does not know:
	// it was never written nor reset and has no registered sink (see
	// SyncStore.Describe). A misspelt feed name is refused rather than
	// reported as an empty feed.
	ErrUnknownFeed = errors.New("unknown feed")

	// ErrInvalid: the caller passed something that breaks a documented rule. It
	// is refused before anything is written; retrying the same call cannot work.
	ErrInvalid = errors.New("invalid input")
)

// LeaseHeldError says which sink's lease is held, and by whom as the store
// knew it when it refused, so that a worker left waiting can say what it waits
// for. It matches ErrLeaseHeld.
type LeaseHeldError struct {
	ID SinkID
	// Holder is the holder recorded on the sink's cursor row when the store
	// refused; "" when the store could not tell (an advisory lock whose
	// holder has not recorded itself yet, or a refusal that did not read the
	// row).
	Holder LeaseHolder
	// ExpiresAt is when that holder's lease row lapses unless it is renewed,
	// by the store's clock (the database's, for pgfeed): the latest a
	// crashed holder keeps the sink. Zero for an advisory holder, whose lease
	// lasts as long as its session, and when Holder is "".
	ExpiresAt time.Time
}

func (e *LeaseHeldError) Error() string {
	msg := fmt.Sprintf("feed %q sink %q: %v", e.ID.Feed, e.ID.Sink, ErrLeaseHeld)
	switch {
	case e.Holder != "" && !e.ExpiresAt.IsZero():
		msg += fmt.Sprintf(" (holder %s, lapsing at %s unless renewed)", e.Holder, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
	case e.Holder != "":
		msg += fmt.Sprintf(" (holder %s, for as long as its session lives)", e.Holder)
	}
	return msg
}

// Is reports whether target is ErrLeaseHeld.
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// LeaseLostError says which sink's lease was lost, and why when known. It
// matches ErrLeaseLost and unwraps to its cause.
type LeaseLostError struct {
	ID     SinkID
	Reason string
	Err    error
}

func (e *LeaseLostError) Error() string {
	msg := fmt.Sprintf("feed %q sink %q: %v", e.ID.Feed, e.ID.Sink, ErrLeaseLost)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns the cause, if any.
func (e *LeaseLostError) Unwrap() error { return e.Err }

// CursorSupersededError says which sink's cursor move lost its guard. It
// matches ErrCursorSuperseded.
type CursorSupersededError struct {
	ID SinkID
	// Generation is not zero when the move was refused because it named a
	// generation older than the feed's, which is then Generation: a rebuild
	// moved the feed on since the caller read it, and the sink must resync.
	// It is zero when the lease holder or the expected cursor did not match.
	Generation Generation
}

func (e *CursorSupersededError) Error() string {
	if e.Generation != 0 {
		return fmt.Sprintf("feed %q sink %q: %v (the feed moved on to generation %d)", e.ID.Feed, e.ID.Sink, ErrCursorSuperseded, e.Generation)
	}
	return fmt.Sprintf("feed %q sink %q: %v (the lease holder or the cursor changed)", e.ID.Feed, e.ID.Sink, ErrCursorSuperseded)
}

// Is reports whether target is ErrCursorSuperseded.
func (e *CursorSupersededError) Is(target error) bool { return target == ErrCursorSuperseded }

// UnknownFeedError says which feed is unknown. It matches ErrUnknownFeed.
type UnknownFeedError struct {
	Feed FeedName
}

func (e *UnknownFeedError) Error() string {
	return fmt.Sprintf("feed %q: %v (never written nor reset, and no sink registered)", e.Feed, ErrUnknownFeed)
}

// Is reports whether target is ErrUnknownFeed.
func (e *UnknownFeedError) Is(target error) bool { return target == ErrUnknownFeed }

// UnreadableError wraps the cause of a failed read. Op says what was being
// read, in words an operator understands. It matches ErrUnreadable.
type UnreadableError struct {
	Op  string
	Err error
}

func (e *UnreadableError) Error() string {
	return fmt.Sprintf("%v: %s: %v", ErrUnreadable, e.Op, e.Err)
}

// Is reports whether target is ErrUnreadable.
func (e *UnreadableError) Is(target error) bool { return target == ErrUnreadable }

// Unwrap returns the cause.
func (e *UnreadableError) Unwrap() error { return e.Err }

// WriteFailedError wraps the cause of a failed write. Op says what was being
// written. It matches ErrWriteFailed.
type WriteFailedError struct {
	Op  string
	Err error
}

func (e *WriteFailedError) Error() string {
	return fmt.Sprintf("%v: %s: %v", ErrWriteFailed, e.Op, e.Err)
}

// Is reports whether target is ErrWriteFailed.
func (e *WriteFailedError) Is(target error) bool { return target == ErrWriteFailed }

// Unwrap returns the cause.
func (e *WriteFailedError) Unwrap() error { return e.Err }

// InvalidError names the input that broke a rule and the rule it broke. It
// matches ErrInvalid. Field is a dotted path a person can find in their code or
// config ("lease.heartbeat", "changes[3].key"); Reason never repeats a secret.
type InvalidError struct {
	Field  string
	Reason string
	Err    error
}

func (e *InvalidError) Error() string {
	msg := fmt.Sprintf("%v: %s: %s", ErrInvalid, e.Field, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the cause, if any.
func (e *InvalidError) Unwrap() error { return e.Err }

// Invalid builds an *InvalidError; format and args make its Reason.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Unreadable wraps err as an *UnreadableError for op, unless err already
// carries one of this package's conditions (a lost lease, an invalid input),
// which pass through unchanged so callers still match them.
func Unreadable(op string, err error) error {
	if err == nil || carriesCondition(err) {
		return err
	}
	return &UnreadableError{Op: op, Err: err}
}

// WriteFailed wraps err as a *WriteFailedError for op, with the same
// pass-through as Unreadable.
func WriteFailed(op string, err error) error {
	if err == nil || carriesCondition(err) {
		return err
	}
	return &WriteFailedError{Op: op, Err: err}
}

func carriesCondition(err error) bool {
	for _, c := range []error{ErrLeaseHeld, ErrLeaseLost, ErrCursorSuperseded, ErrUnreadable, ErrWriteFailed, ErrInvalid, ErrUnknownFeed} {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// RetryDelayer is what an error implements when it knows the earliest a retry
// may work: a sink whose server answered "too many requests, come back in 30
// s" (HTTP's Retry-After). RetryDelay is that wait, 0 when the error does not
// know. The sync driver backs off at least that long before it sends again,
// so a sink that says when need not be hammered by the driver's own shorter
// backoff.
type RetryDelayer interface {
	RetryDelay() time.Duration
}

// RetryDelay returns the longest wait any error in err's chain asks for
// through RetryDelayer, and 0 when none does.
func RetryDelay(err error) time.Duration {
	var d time.Duration
	for err != nil {
		if r, ok := err.(RetryDelayer); ok {
			d = max(d, r.RetryDelay())
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				d = max(d, RetryDelay(e))
			}
			return d
		default:
			return d
		}
	}
	return d
}
