package pgfeed

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

// Defaults of Options.
const (
	// DefaultSchema is the schema the tables live in.
	DefaultSchema = "kairos"
	// DefaultTablePrefix starts every table's name.
	DefaultTablePrefix = "feed_"
	// longestTable is the longest name this package appends to the prefix; the
	// prefix is validated so that prefix + it still fits pgschema.MaxIdentLen.
	longestTable = "generations"
	// DefaultListenTimeout bounds each attempt of the listener to open its
	// session and LISTEN. A server that takes longer is treated as down:
	// workers poll, and the listener tries again with a backoff.
	DefaultListenTimeout = 5 * time.Second
	// DefaultListenCheck is how long the listener's session may stay silent
	// before the listener asks the server whether it is still there.
	DefaultListenCheck = 30 * time.Second
)

// DBTX is what the store runs its statements on: a *pgxpool.Pool in
// production, a *pgx.Conn or a pgx.Tx where the caller wants. Begin is used for
// the store's own short transactions (a cursor move, a retry, a lease take).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Options configure a Store. The zero value is valid and means all defaults.
type Options struct {
	// Schema holds the tables. It must match ^[a-z_][a-z0-9_]*$, fit
	// PostgreSQL's 63-byte identifier limit and not start with "pg_" (which
	// PostgreSQL reserves); it is always quoted. Defaults to DefaultSchema.
	Schema string
	// TablePrefix starts every table's name, so several independent sets of
	// feeds can share a schema. Same rule as Schema, and prefix plus the
	// longest table name ("generations") must fit 63 bytes. pgread's tables
	// may share it (see # Versions in the package doc). Defaults to
	// DefaultTablePrefix.
	TablePrefix string
	// Lease holds the lease-row timings (see feed.LeaseOptions). Zero fields
	// take their defaults. Ignored for advisory leases, which have no expiry.
	Lease feed.LeaseOptions
	// AdvisoryLock, when set, selects the advisory-lock lease kind: each lease
	// reserves one connection of this pool for its lifetime and holds a
	// session advisory lock on it. The pool must be dedicated to leases and
	// must reach PostgreSQL directly, not through a transaction pooler; New
	// refuses one it recognises as pooled. Defaults to nil: lease rows, which
	// work through a transaction pooler and need no reserved connection.
	AdvisoryLock *pgxpool.Pool
	// Clock is the time leases run on. With the system clock (the default),
	// stored times are stamped and compared with the database's
	// clock_timestamp(), and lease ages are measured with Go's monotonic
	// clock. An injected clock (a test's feedtest.ManualClock) replaces both:
	// its Now is passed to every statement that stamps or compares a time.
	// Defaults to feed.SystemClock.
	Clock feed.Clock
	// Listen opens the dedicated connection the store LISTENs on for commit
	// notifications. It must reach PostgreSQL directly: a transaction pooler
	// does not deliver notifications. Defaults to hijacking a connection from
	// db when db is a *pgxpool.Pool, or opening one with db's config when db is
	// a *pgx.Conn; with any other DBTX, Subscribe needs it.
	Listen func(ctx context.Context) (*pgx.Conn, error)
	// ListenTimeout bounds each attempt of the listener to open its session
	// (Listen), LISTEN and check for a pooler, so that a server that accepts
	// a connection and never answers costs an attempt, not the wake-ups for
	// good. Must not be negative. Defaults to DefaultListenTimeout.
	ListenTimeout time.Duration
	// ListenCheck is how long the listener's session may go without a
	// notification before the listener checks it with a round trip, bounded
	// by ListenTimeout. A session waiting for notifications sends nothing,
	// so a network that silently drops its packets (a partition, a NAT or
	// firewall that forgot the connection, a server host gone dark) is seen
	// only by such a check: without it the listener would trust a dead
	// session for as long as TCP takes to give up, and workers would wait a
	// full poll for every commit. A failed check ends the session; the
	// listener reconnects and workers poll meanwhile. Must not be negative.
	// Defaults to DefaultListenCheck.
	ListenCheck time.Duration
	// Sealer tunes the sealer of feeds in the concurrent write mode
	// (RunSealer); see SealerOptions. Defaults to the zero SealerOptions:
	// every default.
	Sealer SealerOptions
	// Logger receives lease renewal failures and listener reconnects.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// names are the validated, quoted, schema-qualified table names, built once.
type names struct {
	schema, prefix string
	generations    string
	rows           string
	cursors        string
	parked         string
	sealers        string
	unsealed       string
	changes        string
	// channel is the NOTIFY channel of every feed under this schema and
	// prefix; the payload is the feed's name.
	channel string
	// cursorChannel is the NOTIFY channel of every cursor move under this
	// schema and prefix, the payload the feed's name; a channel of its own,
	// so that cursor moves never wake a worker waiting for commits.
	cursorChannel string
	// modeChannel is the NOTIFY channel of every write-mode switch under
	// this schema and prefix (SetWriteMode), the payload the feed's name; a
	// channel of its own, so that a sealer waiting on a locked feed is not
	// woken by that feed's every commit.
	modeChannel string
}

// resolveNames validates schema and prefix (empty means default) and builds
// the names.
func resolveNames(schema, prefix string) (names, error) {
	n, err := pgschema.ResolveNames(schema, prefix, DefaultSchema, DefaultTablePrefix, longestTable)
	if err != nil {
		return names{}, err
	}
	schema, prefix, t := n.Schema, n.Prefix, n.Table
	return names{
		schema:        schema,
		prefix:        prefix,
		generations:   t("generations"),
		rows:          t("rows"),
		cursors:       t("cursors"),
		parked:        t("parked"),
		sealers:       t("sealers"),
		unsealed:      t("unsealed"),
		changes:       t("changes"),
		channel:       fmt.Sprintf("kairos_feed_%016x", uint64(lockKey("notify", schema, prefix))),
		cursorChannel: fmt.Sprintf("kairos_cursor_%016x", uint64(lockKey("cursor", schema, prefix))),
		modeChannel:   fmt.Sprintf("kairos_mode_%016x", uint64(lockKey("mode", schema, prefix))),
	}, nil
}
