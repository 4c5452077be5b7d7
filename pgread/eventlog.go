package pgread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/read"
)

// ExpectedVersion is what Append requires of a stream's version before it
// appends: the number of events the stream holds, NoStream, or AnyVersion.
type ExpectedVersion int64

const (
	// AnyVersion appends whatever the stream holds.
	AnyVersion ExpectedVersion = -1
	// NoStream appends only to a stream that has no event yet.
	NoStream ExpectedVersion = 0
)

// MaxAppend is the most events one Append takes.
const MaxAppend = 10_000

// EventData is an event to append: its type (feed's name rule) and its JSON
// document.
type EventData struct {
	Type string
	Data json.RawMessage
}

// AppendResult says where an append landed: the stream's version after it,
// and the global positions of its first and last event.
type AppendResult struct {
	Version     int64
	First, Last read.Position
}

// ErrVersionConflict: an append found its stream at another version than it
// expected. Nothing was appended.
var ErrVersionConflict = errors.New("stream version conflict")

// VersionConflictError says which stream and version an append found. It
// matches ErrVersionConflict.
type VersionConflictError struct {
	Stream   string
	Expected ExpectedVersion
	Actual   int64
}

func (e *VersionConflictError) Error() string {
	return fmt.Sprintf("stream %q: %v: expected version %d, found %d", e.Stream, ErrVersionConflict, e.Expected, e.Actual)
}

// Is reports whether target is ErrVersionConflict.
func (e *VersionConflictError) Is(target error) bool { return target == ErrVersionConflict }

// EventLog is a small append-only event log: streams of events, each stream
// versioned from 1, every event also at a global position a projection can
// replay from the origin. Migrate must have run. It is safe for concurrent
// use, and implements read.EventSource.
//
// # Positions are in commit order
//
// An append starts by adding its size to the log's one head row, which hands
// out a contiguous range of positions and holds the row's lock until the
// appending transaction ends. The next append waits for that end before it
// gets its range, so positions become visible in ascending order: a reader
// that saw position p never later sees a new event below p, and a checkpoint
// at p skips nothing. The cost is that appends serialise across their commit,
// whatever their streams; this log is the replay source of a read side, not a
// high-rate event store.
type EventLog struct {
	db    DBTX
	names names
	sql   logStatements
}

var _ read.EventSource = (*EventLog)(nil)

type logStatements struct {
	// bump takes the head lock and hands out head+1..head+$1. It runs before
	// append, so every appender takes the head first and a stream's row
	// second: two transactions appending to several streams cannot deadlock.
	bump string
	// appendNew (expected NoStream or AnyVersion) and appendAt (expected a
	// version) move the stream's version from $2 (or from anything, for -1)
	// to itself plus $3, appendNew creating the stream, and insert the events
	// at positions ending at $4; they return the new version, or no row when
	// the guard lost (and then nothing was inserted). Under READ COMMITTED
	// the guard is re-checked on the row a concurrent appender committed, so
	// two appends expecting one version never both land.
	appendNew, appendAt string
	// version reads a stream's version, 0 when it has none.
	version string
	// readAll and readStream read events after a position or a version.
	readAll, readStream string
	// head reads the log's head: the highest position handed out.
	head string
}

func (n names) logStatements() logStatements {
	const cols = `position, stream, version, type, data::text, recorded_at`
	insertEvents := `, e AS (
	INSERT INTO ` + n.events + ` (position, stream, version, type, data)
	SELECT $4::bigint - $3::bigint + x.ord, $1::text, s.version - $3::bigint + x.ord, x.type, x.data::jsonb
	FROM s, unnest($5::text[], $6::text[]) WITH ORDINALITY AS x(type, data, ord)
)
SELECT version FROM s`
	return logStatements{
		bump: `UPDATE ` + n.log + ` SET head = head + $1::bigint RETURNING head`,
		appendNew: `WITH s AS (
	INSERT INTO ` + n.streams + ` AS s (stream, version) VALUES ($1::text, $3::bigint)
	ON CONFLICT (stream) DO UPDATE SET version = s.version + excluded.version
	WHERE $2::bigint = -1
	RETURNING s.version
)` + insertEvents,
		appendAt: `WITH s AS (
	UPDATE ` + n.streams + ` SET version = version + $3::bigint
	WHERE stream = $1::text AND version = $2::bigint
	RETURNING version
)` + insertEvents,
		version:    `SELECT coalesce(max(version), 0) FROM ` + n.streams + ` WHERE stream = $1::text`,
		readAll:    `SELECT ` + cols + ` FROM ` + n.events + ` WHERE position > $1::bigint ORDER BY position LIMIT $2::bigint`,
		readStream: `SELECT ` + cols + ` FROM ` + n.events + ` WHERE stream = $1::text AND version > $2::bigint ORDER BY version LIMIT $3::bigint`,
		head:       `SELECT head FROM ` + n.log,
	}
}

// NewEventLog returns an event log over db, or an *feed.InvalidError naming
// what is wrong; it checks db and the tables as NewStore does.
func NewEventLog(ctx context.Context, db DBTX, opts Options) (*EventLog, error) {
	n, err := newNames(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	return &EventLog{db: db, names: n, sql: n.logStatements()}, nil
}

// validStream applies feed's key rule to a stream name: 1 to 512 bytes of
// valid UTF-8 without NUL, so an aggregate's id can be used as it is.
func validStream(stream string) error {
	if err := feed.Key(stream).Validate(); err != nil {
		var inv *feed.InvalidError
		if errors.As(err, &inv) {
			return &feed.InvalidError{Field: "stream", Reason: inv.Reason, Err: inv.Err}
		}
		return err
	}
	return nil
}

// Append appends events to stream inside the caller's tx, when the stream's
// version is expected. A stream at another version refuses with a
// *VersionConflictError; the caller should then roll tx back (positions it
// took are skipped if tx commits anyway, which readers tolerate). Every
// argument is checked before anything is written.
func (l *EventLog) Append(ctx context.Context, tx pgx.Tx, stream string, expected ExpectedVersion, events []EventData) (AppendResult, error) {
	if tx == nil {
		return AppendResult{}, feed.Invalid("tx", "must not be nil")
	}
	if err := validStream(stream); err != nil {
		return AppendResult{}, err
	}
	if expected < AnyVersion {
		return AppendResult{}, feed.Invalid("expected", "is %d; a version is AnyVersion (-1), NoStream (0) or a stream's event count", expected)
	}
	if len(events) == 0 || len(events) > MaxAppend {
		return AppendResult{}, feed.Invalid("events", "has %d events; an append takes 1 to %d", len(events), MaxAppend)
	}
	types := make([]string, len(events))
	datas := make([]string, len(events))
	for i, e := range events {
		if _, err := feed.ParseFeedName(e.Type); err != nil {
			var inv *feed.InvalidError
			if errors.As(err, &inv) {
				return AppendResult{}, &feed.InvalidError{Field: fmt.Sprintf("events[%d].type", i), Reason: inv.Reason}
			}
			return AppendResult{}, err
		}
		// Event data is stored as jsonb, so it follows the feed's document
		// rule: what jsonb would refuse is refused here, before the append.
		if err := feed.ValidateDocument(fmt.Sprintf("events[%d].data", i), e.Data); err != nil {
			return AppendResult{}, err
		}
		types[i], datas[i] = e.Type, string(e.Data)
	}
	n := int64(len(events))
	op := "appending to stream " + stream
	var head int64
	if err := tx.QueryRow(ctx, l.sql.bump, n).Scan(&head); err != nil {
		return AppendResult{}, feed.WriteFailed(op, err)
	}
	var version int64
	stmt := l.sql.appendAt
	if expected <= NoStream {
		stmt = l.sql.appendNew
	}
	err := tx.QueryRow(ctx, stmt, stream, int64(expected), n, head, types, datas).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		var actual int64
		if err := tx.QueryRow(ctx, l.sql.version, stream).Scan(&actual); err != nil {
			return AppendResult{}, feed.WriteFailed(op, err)
		}
		return AppendResult{}, &VersionConflictError{Stream: stream, Expected: expected, Actual: actual}
	}
	if err != nil {
		return AppendResult{}, feed.WriteFailed(op, err)
	}
	return AppendResult{Version: version, First: read.Position(head - n + 1), Last: read.Position(head)}, nil
}

// AppendCommitted is Append in a transaction of its own.
func (l *EventLog) AppendCommitted(ctx context.Context, stream string, expected ExpectedVersion, events []EventData) (AppendResult, error) {
	var res AppendResult
	var appendErr error
	err := pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		res, appendErr = l.Append(ctx, tx, stream, expected, events)
		return appendErr
	})
	switch {
	case err == nil:
		return res, nil
	case appendErr != nil:
		return AppendResult{}, appendErr
	}
	return AppendResult{}, feed.WriteFailed("appending to stream "+stream, err)
}

// ReadAll returns up to limit events after position after, in position
// order; see read.EventSource.
func (l *EventLog) ReadAll(ctx context.Context, after read.Position, limit int) ([]read.Event, error) {
	if after < read.Origin {
		return nil, feed.Invalid("after", "is %d; positions are never negative", after)
	}
	if limit < 1 || limit > feed.MaxBatchLimit {
		return nil, feed.Invalid("limit", "is %d; it must be 1 to %d", limit, feed.MaxBatchLimit)
	}
	return l.query(ctx, "reading the event log", l.sql.readAll, int64(after), int64(limit))
}

// ReadStream returns up to limit events of stream after version after, in
// version order: what an aggregate loads before it appends with its version.
func (l *EventLog) ReadStream(ctx context.Context, stream string, after int64, limit int) ([]read.Event, error) {
	if err := validStream(stream); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, feed.Invalid("after", "is %d; versions are never negative", after)
	}
	if limit < 1 || limit > feed.MaxBatchLimit {
		return nil, feed.Invalid("limit", "is %d; it must be 1 to %d", limit, feed.MaxBatchLimit)
	}
	return l.query(ctx, "reading stream "+stream, l.sql.readStream, stream, after, int64(limit))
}

// Head returns the highest position handed out; an append still in flight
// may hold positions up to it that are not visible yet.
func (l *EventLog) Head(ctx context.Context) (read.Position, error) {
	var head int64
	if err := l.db.QueryRow(ctx, l.sql.head).Scan(&head); err != nil {
		return 0, feed.Unreadable("reading the event log's head", err)
	}
	return read.Position(head), nil
}

func (l *EventLog) query(ctx context.Context, op, stmt string, args ...any) ([]read.Event, error) {
	rows, err := l.db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, feed.Unreadable(op, err)
	}
	defer rows.Close()
	var out []read.Event
	for rows.Next() {
		var (
			e    read.Event
			pos  int64
			data []byte
			at   time.Time
		)
		if err := rows.Scan(&pos, &e.Stream, &e.Version, &e.Type, &data, &at); err != nil {
			return nil, feed.Unreadable(op, err)
		}
		e.Position, e.Data, e.RecordedAt = read.Position(pos), data, at
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, feed.Unreadable(op, err)
	}
	return out, nil
}
