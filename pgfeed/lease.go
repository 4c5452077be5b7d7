package pgfeed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/leaserow"
)

// The two lease kinds, their trade-offs and why they coexist safely are
// explained once, in doc.go ("Leases").

// sinkKey is the advisory lock of one sink: the advisory lease holds it for
// its session, a lease-row take and RemoveSink try it for their transaction.
func (s *Store) sinkKey(id feed.SinkID) int64 {
	return lockKey("sink", s.names.schema, s.names.prefix, string(id.Feed), string(id.Sink))
}

// at is the time parameter for a moment the store measured itself: nil with
// the system clock (the database stamps), t with an injected one.
func (s *Store) at(t time.Time) *time.Time {
	if s.system {
		return nil
	}
	return &t
}

func newHolder(kind string) feed.LeaseHolder {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail on supported platforms
	return feed.LeaseHolder("pg-" + kind + ":" + hex.EncodeToString(b[:]))
}

// AcquireLease takes the lease of id, of the kind the store was built with;
// see feed.SyncStore. It is for implementers (see the package doc): syncer's
// workers take their leases with it.
func (s *Store) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, feed.WriteFailed("taking the lease of "+id.String(), err)
	}
	if s.advisory != nil {
		return s.acquireAdvisory(ctx, id)
	}
	return s.acquireRow(ctx, id)
}

// acquireRow takes a lease row in one short transaction: try the sink's
// advisory lock for the transaction, then the guarded upsert (statements.takeRow),
// which may take over an advisory holder only when that try succeeded. The
// lease's age runs from when the take started, by the store's clock.
func (s *Store) acquireRow(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	holder := newHolder("row")
	ttl := micros(s.lease.TTL)
	takenAt := s.clock.Now()
	var (
		taken bool
		held  *feed.LeaseHeldError
	)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, s.sql.lockSinkXact, s.sinkKey(id)).Scan(&locked); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.sql.takeRow, string(id.Feed), string(id.Sink), string(holder), s.at(takenAt), ttl, locked)
		if err != nil {
			return err
		}
		if taken = tag.RowsAffected() > 0; taken {
			return nil
		}
		// Refused. The upsert locked the row all the same (ON CONFLICT locks
		// the row it judges), so this read, one primary-key lookup on the
		// refusal path only, names the holder that refused the take.
		held, err = s.leaseHeld(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, feed.WriteFailed("taking the lease of "+id.String(), err)
	}
	if !taken {
		return nil, held
	}
	return leaserow.Start(ctx, leaserow.Config{
		ID:      id,
		Holder:  holder,
		Timings: s.lease,
		Clock:   s.clock,
		TakenAt: takenAt,
		Logger:  s.logger,
		Renew: func(ctx context.Context, at time.Time) (bool, error) {
			tag, err := s.db.Exec(ctx, s.sql.renewRow, string(id.Feed), string(id.Sink), string(holder), s.at(at), ttl)
			if err != nil {
				return false, err
			}
			return tag.RowsAffected() > 0, nil
		},
		Clear: func(ctx context.Context) error {
			_, err := s.db.Exec(ctx, s.sql.clearHolder, string(id.Feed), string(id.Sink), string(holder))
			return err
		},
	}), nil
}

// leaseHeld reads who holds id's lease on q into a refusal. An absent row or
// an absent holder leaves the refusal's Holder empty.
func (s *Store) leaseHeld(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id feed.SinkID) (*feed.LeaseHeldError, error) {
	held := &feed.LeaseHeldError{ID: id}
	var (
		holder  *string
		expires *time.Time
	)
	err := q.QueryRow(ctx, s.sql.leaseOf, string(id.Feed), string(id.Sink)).Scan(&holder, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return held, nil
	case err != nil:
		return nil, err
	}
	if holder != nil {
		held.Holder = feed.LeaseHolder(*holder)
		if expires != nil {
			held.ExpiresAt = *expires
		}
	}
	return held, nil
}

// Session settings of an advisory lease's connection. A holder cut off from
// the server by a partition keeps its session lock, and so its lease, until
// the server notices the connection is dead; these make it notice within
// about half a minute instead of the kernel's two hours. Keepalives are used
// rather than idle_session_timeout because a healthy holder that is caught up
// sits idle for as long as its feed is quiet.
const advisorySessionSetup = `SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3; SET tcp_user_timeout = 30000`

// advisoryCheckTimeout bounds EnsureHeld's question to the lock session, so a
// stalled session is a lost lease within it rather than a stuck worker.
const advisoryCheckTimeout = 5 * time.Second

// acquireAdvisory takes an advisory lease: one connection of the lease pool,
// taken out of it for the lease's lifetime, holds the session lock and records
// the holder from that same session (statements.claimAdvisory).
func (s *Store) acquireAdvisory(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	key := s.sinkKey(id)
	pc, err := s.advisory.Acquire(ctx)
	if err != nil {
		return nil, feed.Unreadable("reserving a lease connection for "+id.String(), err)
	}
	// Hijacked: the lease owns the session, and closing it is what lets the
	// lock go for certain; the pool never hands this session to anyone else.
	conn := pc.Hijack()
	fail := func(err error) (feed.Lease, error) {
		closeConn(conn)
		return nil, err
	}
	if _, err := conn.Exec(ctx, advisorySessionSetup, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fail(feed.WriteFailed("preparing the lease session of "+id.String(), err))
	}
	var locked bool
	if err := conn.QueryRow(ctx, s.sql.tryLock, key).Scan(&locked); err != nil {
		return fail(feed.WriteFailed("taking the advisory lock of "+id.String(), err))
	}
	if !locked {
		return fail(s.advisoryRefusal(ctx, conn, id))
	}
	holder := newHolder("advisory")
	tag, err := conn.Exec(ctx, s.sql.claimAdvisory, string(id.Feed), string(id.Sink), string(holder), s.now(), key)
	if err != nil {
		return fail(feed.WriteFailed("recording the lease holder of "+id.String(), err))
	}
	if tag.RowsAffected() == 0 {
		// A live lease row holds the sink: the lock guards nothing, so it goes
		// now, and an advisory worker may try again once that row lapses.
		s.unlockSession(conn, key)
		return fail(s.advisoryRefusal(ctx, conn, id))
	}
	l := &advisoryLease{s: s, id: id, holder: holder, key: key, conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	go l.watch(ctx)
	return l, nil
}

// advisoryRefusal is the refusal of an advisory take, naming the holder the
// row records. The refusal stands whether or not the row can be read: a failed
// read only leaves the holder unnamed.
func (s *Store) advisoryRefusal(ctx context.Context, conn *pgx.Conn, id feed.SinkID) error {
	held, err := s.leaseHeld(ctx, conn, id)
	if err != nil {
		return &feed.LeaseHeldError{ID: id}
	}
	return held
}

// unlockSession lets the session lock go at once, best effort: closing the
// session releases it anyway, but only once the server process has exited,
// and a rival trying right after a release should not be refused meanwhile.
func (s *Store) unlockSession(c *pgx.Conn, key int64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = c.Exec(ctx, s.sql.unlock, key)
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// advisoryLease is a held advisory lease. It implements feed.Lease.
type advisoryLease struct {
	s      *Store
	id     feed.SinkID
	holder feed.LeaseHolder
	key    int64

	mu       sync.Mutex // serialises use of conn
	conn     *pgx.Conn
	lost     error
	released bool
	clearErr error

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (l *advisoryLease) ID() feed.SinkID          { return l.id }
func (l *advisoryLease) Holder() feed.LeaseHolder { return l.holder }

// EnsureHeld asks the lock's own session whether it still holds the lock. A
// session that is gone cannot answer, and any failure to answer is a lost
// lease, for good.
// Margin reports no bound: an advisory lock has no expiry to keep a margin
// from, and its session can die while a call it let through is under way.
func (l *advisoryLease) Margin() (time.Duration, bool) { return 0, false }

func (l *advisoryLease) EnsureHeld(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return &feed.LeaseLostError{ID: l.id, Reason: "released"}
	}
	if l.lost != nil {
		return l.lost
	}
	cctx, cancel := context.WithTimeout(ctx, advisoryCheckTimeout)
	defer cancel()
	var held bool
	if err := l.conn.QueryRow(cctx, l.s.sql.holdsLock, l.key).Scan(&held); err != nil {
		l.lost = &feed.LeaseLostError{ID: l.id, Reason: "the lock session did not answer", Err: err}
		l.dropSession()
		return l.lost
	}
	if !held {
		l.lost = &feed.LeaseLostError{ID: l.id, Reason: "the lock session no longer holds the lock"}
		return l.lost
	}
	return nil
}

// dropSession closes the lock session's socket at once, after a question it
// did not answer: the lease is lost, and the lock should go with it as soon as
// the server notices, which the session's keepalives and tcp_user_timeout
// bound. Closing through pgx would not do: a connection whose query failed
// first sends a cancel request over a new connection and waits up to 15 s
// for it before it closes the socket, and a cancel request to a server the
// session cannot reach waits out all of that, keeping the lock from a rival
// when nothing else ends the session. Called with l.mu held.
func (l *advisoryLease) dropSession() {
	if nc := l.conn.PgConn().Conn(); nc != nil {
		_ = nc.Close()
	}
}

// Release clears the holder from the row (best effort) while the lock is still
// held, then unlocks and closes the session. Safe to call more than once.
func (l *advisoryLease) Release(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	return l.release(ctx)
}

func (l *advisoryLease) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return l.clearErr
	}
	l.released = true
	if _, err := l.s.db.Exec(ctx, l.s.sql.clearHolder, string(l.id.Feed), string(l.id.Sink), string(l.holder)); err != nil {
		l.clearErr = feed.WriteFailed("clearing the lease holder of "+l.id.String(), err)
	}
	if l.lost == nil {
		l.s.unlockSession(l.conn, l.key)
	}
	closeConn(l.conn)
	return l.clearErr
}

// watch releases the lease when the context it was taken with ends.
func (l *advisoryLease) watch(ctx context.Context) {
	defer close(l.done)
	select {
	case <-l.stop:
	case <-ctx.Done():
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.release(rctx)
	}
}

// checkSessionPool refuses a lease pool that recognisably sits behind a
// transaction pooler, which would hand the lock's session to other clients
// between statements. Two checks: the address signs a pooler's URL shows (a
// "-pooler" host, as pooled endpoints are named; PgBouncer's default port
// 6432; a pgbouncer=true parameter), and an active probe: behind a pooler
// the backend pid the server handshake announced is the pooler's invention and
// differs from what pg_backend_pid() says. A pooler that passes both (one that
// forwards the real pid, on an ordinary address) is beyond what this can tell.
// The pool's address is read only to judge it and never repeated.
func checkSessionPool(ctx context.Context, pool *pgxpool.Pool) error {
	cfg := pool.Config().ConnConfig
	hosts := []string{cfg.Host}
	ports := []uint16{cfg.Port}
	for _, fb := range cfg.Fallbacks {
		hosts = append(hosts, fb.Host)
		ports = append(ports, fb.Port)
	}
	var signs []string
	for _, h := range hosts {
		if strings.Contains(h, "-pooler") {
			signs = append(signs, `a "-pooler" host, which is a pooled endpoint`)
			break
		}
	}
	for _, p := range ports {
		if p == 6432 {
			signs = append(signs, "port 6432, PgBouncer's default")
			break
		}
	}
	if strings.EqualFold(cfg.RuntimeParams["pgbouncer"], "true") {
		signs = append(signs, "a pgbouncer=true parameter")
	}
	if len(signs) == 0 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return feed.Unreadable("probing the advisory lock pool", err)
		}
		defer c.Release()
		announced := c.Conn().PgConn().PID()
		var actual uint32
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&actual); err != nil {
			return feed.Unreadable("probing the advisory lock pool", err)
		}
		if announced != actual {
			signs = append(signs, fmt.Sprintf("the server announced backend pid %d but the session runs in backend %d, which a pooler does", announced, actual))
		}
	}
	if len(signs) > 0 {
		return feed.Invalid("options.advisory_lock", "the pool looks like a transaction pooler (%s), which hands a session to other clients between statements and so cannot hold a session lock; give it a direct connection, or use lease rows", strings.Join(signs, "; "))
	}
	return nil
}
