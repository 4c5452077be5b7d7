package pgread_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

func wantField(t *testing.T, name string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	if !errors.As(err, &inv) || inv.Field != field || !errors.Is(err, feed.ErrInvalid) {
		t.Errorf("%s: err = %v, want an InvalidError naming %s", name, err, field)
	}
}

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name  string
		opts  pgread.Options
		field string
	}{
		{"upper-case schema", pgread.Options{Schema: "Kairos"}, "schema"},
		{"quote in schema", pgread.Options{Schema: `a"b`}, "schema"},
		{"long schema", pgread.Options{Schema: long}, "schema"},
		{"digit first", pgread.Options{TablePrefix: "1x"}, "table_prefix"},
		{"prefix too long for its tables", pgread.Options{TablePrefix: strings.Repeat("p", 63-len("checkpoints")+1)}, "table_prefix"},
		{"semicolon", pgread.Options{TablePrefix: "x;drop"}, "table_prefix"},
		{"schema reserved by PostgreSQL", pgread.Options{Schema: "pg_kairos"}, "schema"},
	} {
		_, err := pgread.NewStore(context.Background(), nopDB{}, tc.opts)
		wantField(t, tc.name+" (store)", err, tc.field)
		_, err = pgread.NewEventLog(context.Background(), nopDB{}, tc.opts)
		wantField(t, tc.name+" (log)", err, tc.field)
		_, err = pgread.Migrate(context.Background(), nopDB{}, tc.opts)
		wantField(t, tc.name+" (migrate)", err, tc.field)
		_, err = pgread.MigrationSQL(tc.opts)
		wantField(t, tc.name+" (sql)", err, tc.field)
	}
	_, err := pgread.NewStore(context.Background(), nil, pgread.Options{})
	wantField(t, "nil db", err, "db")
	_, err = pgread.NewEventLog(context.Background(), nil, pgread.Options{})
	wantField(t, "nil db", err, "db")
	_, err = pgread.Migrate(context.Background(), nil, pgread.Options{})
	wantField(t, "nil db", err, "db")
	// The longest prefix that fits is accepted (the constructors, which
	// share the rule, would go on to ask nopDB whether it is migrated).
	if _, err := pgread.MigrationSQL(pgread.Options{TablePrefix: strings.Repeat("p", 63-len("checkpoints"))}); err != nil {
		t.Errorf("longest prefix refused: %v", err)
	}
}

func TestStoreBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 10e9)
	s := e.store
	wantField(t, "commit empty projection", s.Commit(ctx, read.CheckpointKey{}, ckpt(0, 0), 1, nil), "checkpoint.projection")
	wantField(t, "commit bad partition", s.Commit(ctx, read.CheckpointKey{Projection: "p", Partition: "a b"}, ckpt(0, 0), 1, nil), "checkpoint.partition")
	wantField(t, "commit next not above", s.Commit(ctx, keyEU, ckpt(3, 0), 3, nil), "commit.next")
	wantField(t, "commit negative", s.Commit(ctx, keyEU, ckpt(-1, 0), 3, nil), "commit.expected.position")
	wantField(t, "commit negative epoch", s.Commit(ctx, keyEU, ckpt(0, -1), 3, nil), "commit.expected.epoch")
	_, err := s.ReadCheckpoint(ctx, read.CheckpointKey{Projection: "a\x00"})
	wantField(t, "read bad key", err, "checkpoint.projection")
	wantField(t, "reset bad key", s.ResetCheckpoint(ctx, read.CheckpointKey{}), "checkpoint.projection")
	wantField(t, "reset tx nil", s.ResetCheckpointTx(ctx, nil, keyEU), "tx")
	fs := withFeed(t, e, orders, keyEU)
	wantField(t, "decorated reset bad key", fs.ResetCheckpoint(ctx, read.CheckpointKey{}), "checkpoint.projection")
	wantField(t, "decorated commit bad key", fs.Commit(ctx, read.CheckpointKey{}, ckpt(0, 0), 1, nil), "checkpoint.projection")
	if at := checkpoint(t, s, keyEU); at != ckpt(0, 0) {
		t.Fatalf("refused calls moved the checkpoint to %v", at)
	}
}

// nopDB is a DBTX that must never be reached: validation runs first.
type nopDB struct{ pgread.DBTX }
