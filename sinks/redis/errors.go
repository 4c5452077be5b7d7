package redis

import (
	"context"
	"errors"
	"fmt"
	"net"

	goredis "github.com/redis/go-redis/v9"
)

// The kinds of sink error, matched with errors.Is. Each is an error of the
// sink, never a rejection: the worker retries the whole batch. An error of
// one kind also unwraps to go-redis's own error, so goredis.IsOOMError and
// the like still answer.
var (
	// ErrOutOfMemory: the server refused a write over its maxmemory (OOM).
	ErrOutOfMemory = errors.New("the server is out of memory (OOM)")
	// ErrReadOnly: the server is a read-only replica (READONLY), as after a
	// failover that the client has not followed yet.
	ErrReadOnly = errors.New("the server is a read-only replica (READONLY)")
	// ErrTimeout: the call ran out of time (its context or a socket
	// deadline).
	ErrTimeout = errors.New("timed out")
	// ErrConnection: the server could not be reached, or a connection was
	// lost mid-call.
	ErrConnection = errors.New("connection failed")
	// ErrServer: any other error the server answered (LOADING, BUSY,
	// CLUSTERDOWN, a script error).
	ErrServer = errors.New("server error")
	// ErrSuperseded: a resync's namespace was retired under it, by a later
	// OpenResync (a rival worker's) or an Abort; it can no longer be
	// published.
	ErrSuperseded = errors.New("the resync was superseded by a later OpenResync or aborted")
	// ErrNoPointer: the meta hash that names the live copy is gone (the
	// server lost its data, or someone deleted it). The sink writes nothing
	// rather than fill a copy that misses everything before; see doc.go,
	// # Failures.
	ErrNoPointer = errors.New("the meta hash naming the live copy is gone")
)

// sinkError is an error of the sink during op: its kind and its cause.
type sinkError struct {
	op   string
	kind error
	err  error
}

func (e *sinkError) Error() string {
	return fmt.Sprintf("redis: %s: %v: %v", e.op, e.kind, e.err)
}

func (e *sinkError) Unwrap() []error { return []error{e.kind, e.err} }

// classify wraps err, met during op, with its kind. It is the one place
// that sorts the client's errors; everything it returns is a sink error.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	var rerr goredis.Error
	var nerr net.Error
	switch {
	case goredis.IsOOMError(err):
		kind = ErrOutOfMemory
	case goredis.IsReadOnlyError(err):
		kind = ErrReadOnly
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &nerr) && nerr.Timeout(), errors.Is(err, goredis.ErrPoolTimeout):
		kind = ErrTimeout
	case errors.As(err, &rerr):
		kind = ErrServer
	default: // io.EOF, a reset or refused connection, a closed client
		kind = ErrConnection
	}
	return &sinkError{op: op, kind: kind, err: err}
}

// isNoScript says the server does not have a script cached (a restart, a
// failover, SCRIPT FLUSH): it ran nothing, and the call is sent again as
// EVAL.
func isNoScript(err error) bool { return goredis.HasErrorPrefix(err, "NOSCRIPT") }
