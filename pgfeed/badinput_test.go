package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	if !errors.Is(err, feed.ErrInvalid) || !errors.As(err, &inv) || inv.Field != field {
		t.Errorf("%s: got %v; want an *feed.InvalidError naming %q", what, err, field)
	}
}

// TestBadIdentifiers: schema and prefix are refused by New, Migrate,
// Migrations and MigrationSQL alike, before any statement runs, and the
// database is left without the schema.
func TestBadIdentifiers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	long := strings.Repeat("a", 64)
	cases := []struct {
		name, schema, prefix, field string
	}{
		{"quote in schema", `ka"iros`, "", "schema"},
		{"single quote in schema", `ka'iros`, "", "schema"},
		{"semicolon in schema", "kairos;drop", "", "schema"},
		{"dot in schema", "kairos.x", "", "schema"},
		{"upper case schema", "Kairos", "", "schema"},
		{"NUL in schema", "kai\x00ros", "", "schema"},
		{"leading digit", "1kairos", "", "schema"},
		{"space", "kai ros", "", "schema"},
		{"non-ASCII", "kaïros", "", "schema"},
		{"64-byte schema", long, "", "schema"},
		{"schema reserved by PostgreSQL", "pg_kairos", "", "schema"},
		{"quote in prefix", "", `feed"_`, "table_prefix"},
		{"semicolon in prefix", "", "f;", "table_prefix"},
		{"dot in prefix", "", "f.", "table_prefix"},
		{"upper case prefix", "", "Feed_", "table_prefix"},
		{"NUL in prefix", "", "f\x00", "table_prefix"},
		{"prefix too long with its tables", "", strings.Repeat("p", 63-len("generations")+1), "table_prefix"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: c.schema, TablePrefix: c.prefix})
			wantInvalid(t, "New", err, c.field)
			_, err = pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: c.schema, TablePrefix: c.prefix})
			wantInvalid(t, "Migrate", err, c.field)
			_, err = pgfeed.Migrations(pgfeed.Options{Schema: c.schema, TablePrefix: c.prefix})
			wantInvalid(t, "Migrations", err, c.field)
			_, err = pgfeed.MigrationSQL(pgfeed.Options{Schema: c.schema, TablePrefix: c.prefix})
			wantInvalid(t, "MigrationSQL", err, c.field)
			if err != nil && strings.ContainsRune(err.Error(), 0) {
				t.Errorf("the error carries a NUL byte: %q", err)
			}
		})
	}
	// The longest names that fit are accepted, and work.
	schema := pgtest.Schema(t)
	prefix := strings.Repeat("p", 63-len("generations"))
	if _, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema, TablePrefix: prefix}); err != nil {
		t.Fatalf("Migrate with a %d-byte prefix: %v", len(prefix), err)
	}
	if s, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema, TablePrefix: prefix}); err != nil {
		t.Fatalf("New with a %d-byte prefix: %v", len(prefix), err)
	} else {
		s.Close()
	}
	// A 63-byte schema passes the rule: New goes on to find it unmigrated.
	if _, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: strings.Repeat("s", 63), TablePrefix: prefix}); !errors.Is(err, pgfeed.ErrNotMigrated) {
		t.Fatalf("New with a 63-byte schema: %v; want ErrNotMigrated, the names accepted", err)
	}
}

// TestBadOptions: nil db, lease timings, a negative listen timeout, and a Subscribe that has no way to
// listen are refused with the field named.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	_, err := pgfeed.New(t.Context(), nil, pgfeed.Options{})
	wantInvalid(t, "New(nil db)", err, "db")
	for _, c := range []struct {
		lease feed.LeaseOptions
		field string
	}{
		{feed.LeaseOptions{TTL: -time.Second}, "lease.ttl"},
		{feed.LeaseOptions{TTL: 10 * time.Second, Heartbeat: 10 * time.Second}, "lease.heartbeat"},
		{feed.LeaseOptions{TTL: 10 * time.Second, Heartbeat: 5 * time.Second, Margin: 5 * time.Second}, "lease.margin"},
	} {
		_, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Lease: c.lease})
		wantInvalid(t, "New("+c.lease.String()+")", err, c.field)
	}
	_, err = pgfeed.New(t.Context(), pool, pgfeed.Options{ListenTimeout: -time.Second})
	wantInvalid(t, "New(listen timeout -1s)", err, "options.listen_timeout")
	_, err = pgfeed.New(t.Context(), pool, pgfeed.Options{ListenCheck: -time.Second})
	wantInvalid(t, "New(listen check -1s)", err, "options.listen_check")
	for _, c := range []struct {
		o     pgfeed.SealerOptions
		field string
	}{
		{pgfeed.SealerOptions{Limit: -1}, "options.sealer.limit"},
		{pgfeed.SealerOptions{MinPoll: -time.Millisecond}, "options.sealer.min_poll"},
		{pgfeed.SealerOptions{Linger: -time.Millisecond}, "options.sealer.linger"},
		{pgfeed.SealerOptions{MinPoll: time.Second, MaxPoll: time.Millisecond}, "options.sealer.max_poll"},
	} {
		_, err = pgfeed.New(t.Context(), pool, pgfeed.Options{Sealer: c.o})
		wantInvalid(t, fmt.Sprintf("New(sealer %+v)", c.o), err, c.field)
	}
	// A DBTX that is neither a pool nor a conn needs Options.Listen.
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s, err := pgfeed.New(t.Context(), wrappedDB{d.pool}, pgfeed.Options{Schema: d.schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Subscribe(t.Context(), "f")
	wantInvalid(t, "Subscribe without a way to listen", err, "options.listen")
}

type wrappedDB struct{ *pgxpool.Pool }

// TestPasswordNeverEchoed: a lease pool whose server cannot be reached fails
// New with an error that names neither the password nor the full URL.
func TestPasswordNeverEchoed(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	const url = "postgres://kairos:hunter2-very-secret@127.0.0.1:1/app?connect_timeout=2"
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = pgfeed.New(ctx, d.pool, pgfeed.Options{Schema: d.schema, AdvisoryLock: pool})
	if !errors.Is(err, feed.ErrUnreadable) {
		t.Fatalf("New with an unreachable lease pool = %v; want ErrUnreadable", err)
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), url) {
		t.Fatalf("the error echoes the password: %v", err)
	}
}

// TestFeedInputRefusedBeforeWriting: a bad change refuses the whole batch and
// takes no seq; bad reads and moves name their field.
func TestFeedInputRefusedBeforeWriting(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeSimpleProtocol)
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	_, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a", []byte(`{}`)), feed.Put("b", []byte(`{"x":"\u0000"}`))})
	wantInvalid(t, "a \\u0000 document", err, "changes[1].doc")
	_, err = s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a\x00b", []byte(`{}`))})
	wantInvalid(t, "a NUL key", err, "changes[0].key")
	_, err = s.WriteCommitted(ctx, `f"; drop`, []feed.Change{feed.Put("a", []byte(`{}`))})
	wantInvalid(t, "a feed name with a quote", err, "feed name")
	_, err = s.Write(ctx, nil, "f", nil)
	wantInvalid(t, "a nil tx", err, "tx")
	if h, err := s.Head(ctx, "f"); err != nil || h != 0 {
		t.Fatalf("after refused writes, head = %d, %v; want 0", h, err)
	}
	_, err = s.ReadBatch(ctx, "f", -1, feed.BatchLimit{Records: 10})
	wantInvalid(t, "a negative after", err, "after")
	_, err = s.ReadBatch(ctx, "f", 0, feed.BatchLimit{Records: feed.MaxBatchLimit + 1})
	wantInvalid(t, "an over-large limit", err, "limit.records")
	_, err = s.RetryParked(ctx, feed.SinkID{Feed: "f", Sink: "s"}, "")
	wantInvalid(t, "an empty key", err, "key")
	_, err = s.AcquireLease(ctx, feed.SinkID{Feed: "f", Sink: "S P"})
	wantInvalid(t, "a sink name with a space", err, "sink name")
	// Keys and documents that need escaping in SQL round-trip as data.
	odd := feed.Key(`it's "quoted"; DROP TABLE x; -- \ ✓`)
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put(odd, []byte(`{"q": "it's \"x\"; --", "n": [1, 2.5e3]}`))}); err != nil {
		t.Fatal(err)
	}
	b, err := s.ReadBatch(ctx, "f", 0, feed.BatchLimit{Records: 10})
	if err != nil || len(b.Records) != 1 || b.Records[0].Key != odd {
		t.Fatalf("the odd key read back as %+v, %v", b.Records, err)
	}
}
