package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// DefaultTestDSN is the server tests use when KAIROS_TEST_MYSQL_DSN is unset.
const DefaultTestDSN = "root@tcp(127.0.0.1:3306)/test"

func testDSN() string {
	if d := os.Getenv("KAIROS_TEST_MYSQL_DSN"); d != "" {
		return d
	}
	return DefaultTestDSN
}

// adminDB is a pool of the test's own, beside the sink's, for setting up and
// reading tables. A server that does not answer fails the test under CI and
// skips it elsewhere.
func adminDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", testDSN())
	if err != nil {
		t.Fatalf("opening the test MySQL DSN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		pgtest.Unavailable(t, "the test MySQL/MariaDB server", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// tableName returns a fresh table name and drops the table, and whatever
// resync tables of it are left, at cleanup.
func tableName(t testing.TB, db *sql.DB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, n := range tablesOf(t, db, name) {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+n+"`"); err != nil {
				t.Errorf("dropping %s: %v", n, err)
			}
		}
	})
	return name
}

// tablesOf lists the table name and every table whose name starts with it.
func tablesOf(t testing.TB, db *sql.DB, name string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ? ORDER BY TABLE_NAME`, strings.ReplaceAll(name, "_", `\_`)+"%")
	if err != nil {
		t.Fatalf("listing tables: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// contents reads what table serves: its documents, tombstone rows left out.
func contents(ctx context.Context, db *sql.DB, table string) (map[feed.Key]json.RawMessage, error) {
	rows, err := db.QueryContext(ctx, "SELECT `key`, `doc` FROM `"+table+"` WHERE `doc` IS NOT NULL")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[feed.Key]json.RawMessage{}
	for rows.Next() {
		var k, d []byte
		if err := rows.Scan(&k, &d); err != nil {
			return nil, err
		}
		out[feed.Key(k)] = json.RawMessage(d)
	}
	return out, rows.Err()
}

// The fault dialer: sinks under test connect through a network of the
// test's own, so a test can close their connections and send their new
// ones to a closed port, and later let them through again.
const faultNet = "kairos_fault"

var (
	faultOnce  sync.Once
	faultMu    sync.Mutex
	faultLinks = map[string]*faultLink{}
)

// faultLink is one sink's way to its server.
type faultLink struct {
	real   string // the server's address
	closed string // a port nothing listens on
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

// Down closes the link's connections and sends new ones to a closed port;
// the returned func lets them through again.
func (l *faultLink) Down() (restore func()) {
	l.mu.Lock()
	l.down = true
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.down = false
		l.mu.Unlock()
	}
}

func (l *faultLink) dial(ctx context.Context) (net.Conn, error) {
	l.mu.Lock()
	addr := l.real
	if l.down {
		addr = l.closed
	}
	l.mu.Unlock()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down { // it went down while we dialled
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errDown}
	}
	l.conns = append(l.conns, c)
	return c, nil
}

var errDown = &net.AddrError{Err: "the test took the link down", Addr: "fault"}

// faultDSN returns the test DSN routed through a new fault link.
func faultDSN(t testing.TB) (string, *faultLink) {
	t.Helper()
	faultOnce.Do(func() {
		gomysql.RegisterDialContext(faultNet, func(ctx context.Context, addr string) (net.Conn, error) {
			faultMu.Lock()
			l := faultLinks[addr]
			faultMu.Unlock()
			if l == nil {
				return nil, &net.AddrError{Err: "no such fault link", Addr: addr}
			}
			return l.dial(ctx)
		})
	})
	cfg, err := gomysql.ParseDSN(testDSN())
	if err != nil {
		t.Fatalf("parsing the test DSN: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "link-" + hex.EncodeToString(b[:])
	l := &faultLink{real: cfg.Addr, closed: pgtest.ClosedPort(t)}
	faultMu.Lock()
	faultLinks[id] = l
	faultMu.Unlock()
	t.Cleanup(func() {
		faultMu.Lock()
		delete(faultLinks, id)
		faultMu.Unlock()
	})
	cfg.Net, cfg.Addr = faultNet, id
	return cfg.FormatDSN(), l
}

// openSink opens a sink over table through a fault link, closed at cleanup.
func openSink(t testing.TB, table string, create bool) (*Sink, *faultLink) {
	t.Helper()
	dsn, link := faultDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, Options{Table: table, Create: create})
	if err != nil {
		t.Fatalf("Open(%s): %v", table, err)
	}
	t.Cleanup(func() { s.Close() })
	return s, link
}
