// Package pgtest gives each test its own PostgreSQL schema, so tests that
// touch the database run in parallel and leave nothing behind.
//
// The database comes from KAIROS_TEST_DATABASE_URL (default: the local
// PostgreSQL as user postgres). When it cannot be reached a test fails if the
// CI environment variable is set, and is skipped otherwise, so a laptop
// without PostgreSQL can still run the rest of the tests.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the database tests use when KAIROS_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres"

// URL returns the test database's URL.
func URL() string {
	if u := os.Getenv("KAIROS_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Unavailable fails the test in CI and skips it elsewhere; what says why the
// database (or service) is missing.
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is unavailable (CI is set, so this is a failure): %v", what, err)
	}
	t.Skipf("%s is unavailable: %v", what, err)
}

// Pool opens a pool on url with the given exec mode, closed at cleanup.
func Pool(t testing.TB, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, url, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
}

// PoolWith opens a pool on url, configured by configure, closed at cleanup. A
// database that cannot be reached is Unavailable.
func PoolWith(t testing.TB, url string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parsing the test database URL: %v", err)
	}
	cfg.MaxConns = 8
	configure(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		Unavailable(t, "the test database", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema returns a fresh random schema name and drops the schema (whatever a
// test created in it) at cleanup, through its own connection so that it runs
// after the test's pools are gone.
func Schema(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// ClosedPort returns an address on 127.0.0.1 that nothing listens on (a port
// the kernel handed out a moment ago and that was let go again), for tests of
// a server that cannot be reached.
func ClosedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
