package pgfeed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

func bind(ctx context.Context, t *testing.T, d db, s *pgfeed.Store, f feed.FeedName, projection, partition string) (string, string) {
	t.Helper()
	var p, q string
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var err error
		p, q, err = s.BindTx(ctx, tx, f, projection, partition)
		return err
	})
	if err != nil {
		t.Fatalf("BindTx(%s, %s, %s): %v", f, projection, partition, err)
	}
	return p, q
}

// The first binding is recorded and every later one reads it back, across a
// write and a rebuild; a feed's binding never moves.
func TestBindTx(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if p, q := bind(ctx, t, d, s, "orders", "orders", "eu"); p != "orders" || q != "eu" {
		t.Fatalf("first binding = %q %q", p, q)
	}
	if g, err := s.Generation(ctx, "orders"); err != nil || g != 1 {
		t.Fatalf("a binding created generation %d, %v; want 1", g, err)
	}
	if h, err := s.Head(ctx, "orders"); err != nil || h != 0 {
		t.Fatalf("a binding created head %d, %v; want 0", h, err)
	}
	if _, err := s.WriteCommitted(ctx, "orders", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { _, err := s.ResetTx(ctx, tx, "orders"); return err }); err != nil {
		t.Fatal(err)
	}
	for _, other := range [][2]string{{"orders", ""}, {"invoices", "eu"}, {"orders", "us"}} {
		if p, q := bind(ctx, t, d, s, "orders", other[0], other[1]); p != "orders" || q != "eu" {
			t.Fatalf("binding %v over the first returned %q %q; want the first binding", other, p, q)
		}
	}
	// An unpartitioned binding reads back with an empty partition, on a feed
	// that was written before it was bound.
	if _, err := s.WriteCommitted(ctx, "carts", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	if p, q := bind(ctx, t, d, s, "carts", "carts", ""); p != "carts" || q != "" {
		t.Fatalf("unpartitioned binding = %q %q", p, q)
	}
	if p, q := bind(ctx, t, d, s, "carts", "carts", "x"); p != "carts" || q != "" {
		t.Fatalf("a partition over an unpartitioned binding = %q %q", p, q)
	}
}

func TestBindAndLockBadInput(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	check := func(name string, err error, field string) {
		t.Helper()
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("%s: err = %v, want an InvalidError naming %s", name, err, field)
		}
	}
	_, _, err = s.BindTx(ctx, nil, "f", "p", "")
	check("bind nil tx", err, "tx")
	_, _, err = s.BindTx(ctx, tx, "bad feed", "p", "")
	check("bind bad feed", err, "feed name")
	_, _, err = s.BindTx(ctx, tx, "f", "", "")
	check("bind empty projection", err, "projection")
	_, _, err = s.BindTx(ctx, tx, "f", "p", "a b")
	check("bind bad partition", err, "partition")
	check("lock nil tx", s.LockTx(ctx, nil, "f"), "tx")
	check("lock bad feed", s.LockTx(ctx, tx, ""), "feed name")
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM "`+d.schema+`".feed_generations`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d generations rows after refusals (%v), want 0", n, err)
	}
}

// LockTx holds the feed lock to its transaction's end: a write of the feed
// waits for it, on a feed that had no generations row before as well.
func TestLockTx(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, f := range []feed.FeedName{"fresh", "fresh"} { // absent row, then present
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A failure below ends the test with tx still open, and the pool's
		// close at cleanup would wait for it; and the write it holds up
		// must end before the goroutine leak check.
		done, finished := make(chan error, 1), make(chan struct{})
		wrote := false
		defer func() {
			_ = tx.Rollback(context.Background())
			if wrote {
				<-finished
			}
		}()
		if err := s.LockTx(ctx, tx, f); err != nil {
			t.Fatal(err)
		}
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		wrote = true
		go func() {
			defer close(finished)
			_, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("k", []byte(`{}`))})
			done <- err
		}()
		blockedBy(t, ctx, d, pid, done, "a write")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if g, err := s.Generation(ctx, "fresh"); err != nil || g != 1 {
		t.Fatalf("generation %d, %v after LockTx and writes; want 1", g, err)
	}
}
