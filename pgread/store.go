package pgread

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/read"
)

// Store is the durable read.ProjectionStore: one checkpoint row per
// (projection, partition), committed in the same transaction as the
// projection's view writes and any feed rows they carry. Migrate must have
// run. It is safe for concurrent use.
type Store struct {
	db    DBTX
	names names
	sql   storeStatements
}

var (
	_ read.ProjectionStore[pgx.Tx] = (*Store)(nil)
	_ TxStore                      = (*Store)(nil)
)

// storeStatements are the checkpoint statements, built once from validated
// names; parameters carry explicit casts, so the text means the same in every
// pgx exec mode, the simple protocol included.
//
// A key with no row is the zero read.Checkpoint: the origin of epoch 0. The
// first reset creates the row at the origin of epoch 1; rows migrated from
// before epochs existed are in epoch 0, where they were.
type storeStatements struct {
	// read returns the position and epoch, 0 and 0 when the key has no row.
	read string
	// casOrigin creates the row at $3 in epoch 0 when the key has none: the
	// commit expected the zero checkpoint. A row that exists (a rival
	// committed from the origin first, or a reset moved the epoch on) makes
	// it land nothing; when that row is not committed yet, the insert waits
	// for its transaction's end first.
	casOrigin string
	// cas moves the row from position $3 in epoch $5 to position $4, and
	// lands nothing when it is elsewhere, in position or epoch. Under READ
	// COMMITTED an UPDATE that waited for a rival's lock re-checks its WHERE
	// on the row the rival committed, so two commits from one checkpoint
	// never both land, and a commit that waited for a reset finds its epoch
	// moved on.
	cas string
	// reset moves the row to the origin of the next epoch, creating it in
	// epoch 1 when the key has none. It locks the row (or, creating it, the
	// key's index entry) to the transaction's end.
	reset string
}

func (n names) storeStatements() storeStatements {
	c := n.checkpoints
	return storeStatements{
		read: `SELECT coalesce(max(position), 0), coalesce(max(epoch), 0) FROM ` + c + ` WHERE projection = $1::text AND partition = $2::text`,
		casOrigin: `INSERT INTO ` + c + ` (projection, partition, position, epoch) VALUES ($1::text, $2::text, $3::bigint, 0)
ON CONFLICT (projection, partition) DO NOTHING RETURNING 1`,
		cas: `UPDATE ` + c + ` SET position = $4::bigint, updated_at = clock_timestamp()
WHERE projection = $1::text AND partition = $2::text AND position = $3::bigint AND epoch = $5::bigint RETURNING 1`,
		reset: `INSERT INTO ` + c + ` AS c (projection, partition, position, epoch) VALUES ($1::text, $2::text, 0, 1)
ON CONFLICT (projection, partition) DO UPDATE SET position = 0, epoch = c.epoch + 1, updated_at = clock_timestamp()`,
	}
}

// NewStore returns a store over db, or an *feed.InvalidError naming what is
// wrong. Like pgfeed.New, it then checks, bounded by ctx, that db answers
// (else an *feed.UnreadableError) and that the tables are migrated to the
// version this build needs (else a *pgfeed.NotMigratedError).
func NewStore(ctx context.Context, db DBTX, opts Options) (*Store, error) {
	n, err := newNames(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, names: n, sql: n.storeStatements()}, nil
}

// Durability is read.Durable.
func (*Store) Durability() read.Durability { return read.Durable }

// Begin opens a transaction on the store's own db. WithFeed runs its reset in
// it, so the reset, the generation bump and the feed's emptying share one
// connection.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// ReadCheckpoint returns key's checkpoint; the zero read.Checkpoint when it
// never moved.
func (s *Store) ReadCheckpoint(ctx context.Context, key read.CheckpointKey) (read.Checkpoint, error) {
	if err := key.Validate(); err != nil {
		return read.Checkpoint{}, err
	}
	return s.readCheckpoint(ctx, s.db, key)
}

func (s *Store) readCheckpoint(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key read.CheckpointKey) (read.Checkpoint, error) {
	var at, epoch int64
	if err := db.QueryRow(ctx, s.sql.read, key.Projection, key.Partition).Scan(&at, &epoch); err != nil {
		return read.Checkpoint{}, feed.Unreadable("reading checkpoint "+key.String(), err)
	}
	return read.Checkpoint{Position: read.Position(at), Epoch: epoch}, nil
}

// Commit runs apply in a new transaction, then moves key's checkpoint from
// expected to next in it, and commits; see read.ProjectionStore. apply gets
// the transaction: the view's writes and pgfeed's Write join it, so a lost
// guard rolls back all three. The guard compares the epoch as well as the
// position, so a commit that waited for a reset loses even from the origin.
//
// The checkpoint row is locked only after apply has run. A feed write inside
// apply takes the feed lock (the feed's generations row) first, so a commit
// takes the feed lock, then the checkpoint row: the order WithFeed's reset
// takes them in, so the two never deadlock, whether or not apply wrote to a
// feed. apply's own error is returned unchanged; a database failure is a
// *feed.WriteFailedError; a lost guard is a *read.CheckpointSupersededError
// carrying the checkpoint, position and epoch, it was found at.
func (s *Store) Commit(ctx context.Context, key read.CheckpointKey, expected read.Checkpoint, next read.Position, apply func(ctx context.Context, tx pgx.Tx) error) error {
	if err := read.ValidateCommit(key, expected, next); err != nil {
		return err
	}
	var applyErr, guardErr error
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if apply != nil {
			if applyErr = apply(ctx, tx); applyErr != nil {
				return applyErr
			}
		}
		stmt, args := s.sql.cas, []any{key.Projection, key.Partition, int64(expected.Position), int64(next), expected.Epoch}
		if expected == (read.Checkpoint{}) {
			stmt, args = s.sql.casOrigin, []any{key.Projection, key.Partition, int64(next)}
		}
		tag, err := tx.Exec(ctx, stmt, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		at, err := s.readCheckpoint(ctx, tx, key)
		if err != nil {
			return err
		}
		guardErr = &read.CheckpointSupersededError{Key: key, Expected: expected, Actual: at}
		return guardErr
	})
	switch {
	case err == nil:
		return nil
	case applyErr != nil && errors.Is(err, applyErr):
		return applyErr
	case guardErr != nil && errors.Is(err, guardErr):
		return guardErr
	}
	return feed.WriteFailed("committing checkpoint "+key.String(), err)
}

// ResetCheckpoint moves key back to read.Origin, in its next epoch, in a
// transaction of its own. Emptying the view first is the caller's job (see
// WithFeed).
func (s *Store) ResetCheckpoint(ctx context.Context, key read.CheckpointKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, s.sql.reset, key.Projection, key.Partition); err != nil {
		return feed.WriteFailed("resetting checkpoint "+key.String(), err)
	}
	return nil
}

// ResetCheckpointTx moves key back to read.Origin, in its next epoch, inside
// the caller's tx. It locks the checkpoint row to tx's end, so a commit that
// read the checkpoint before the reset and waits for that lock then finds
// the epoch moved on, and loses, whatever position it expected.
func (s *Store) ResetCheckpointTx(ctx context.Context, tx pgx.Tx, key read.CheckpointKey) error {
	if tx == nil {
		return feed.Invalid("tx", "must not be nil")
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.sql.reset, key.Projection, key.Partition); err != nil {
		return feed.WriteFailed("resetting checkpoint "+key.String(), err)
	}
	return nil
}
