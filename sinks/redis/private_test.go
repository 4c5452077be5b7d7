package redis_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/redis"
)

// privateServer starts a redis-server of the test's own on a spare port,
// with args, so a test can give it a configuration the shared server must
// not have (a tiny maxmemory, a replica's role, an evicting policy). It
// keeps nothing on disk and is killed at cleanup.
func privateServer(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		pgtest.Unavailable(t, "redis-server (for a private server)", err)
	}
	addr := pgtest.ClosedPort(t)
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("the private redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}

func privateSink(t *testing.T, addr string) (*redis.Sink, error) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := redis.New(ctx, c, redis.Options{Prefix: "kp:"})
	if err == nil {
		t.Cleanup(s.Close)
	}
	return s, err
}

// A real server out of memory answers OOM: an error of that kind, never a
// rejection, and once memory is freed the same batch lands.
func TestRealServerOutOfMemory(t *testing.T) {
	t.Parallel()
	addr := privateServer(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	s, err := privateSink(t, addr)
	if err != nil {
		t.Fatal(err)
	}
	filler := goredis.NewClient(&goredis.Options{Addr: addr})
	defer filler.Close()
	// Fill in ever smaller values: a refused value's command is freed with
	// it, so one size alone can stop as much as a value short of the limit,
	// where the sink's small batch would still fit.
	n := 0
	for _, size := range []int{64 << 10, 1 << 10, 16} {
		v := strings.Repeat("x", size)
		for ; ; n++ {
			if err := filler.Set(t.Context(), "fill:"+strconv.Itoa(n), v, 0).Err(); err != nil {
				if !goredis.IsOOMError(err) {
					t.Fatalf("filling the server: %v", err)
				}
				break
			}
			if n > 100000 {
				t.Fatal("the server never ran out of memory")
			}
		}
	}
	batch := []feed.Record{rec("a", 1, `{"v":1}`), rec("b", 2, `{"v":2}`)}
	rej, err := s.Apply(t.Context(), batch)
	if len(rej) != 0 || !errors.Is(err, redis.ErrOutOfMemory) || !goredis.IsOOMError(err) {
		t.Fatalf("Apply on a full server = %v, %v; want an ErrOutOfMemory error, no rejection", rej, err)
	}
	if err := filler.FlushDB(t.Context()).Err(); err != nil { // a private server: ours to empty
		t.Fatal(err)
	}
	if s, err = privateSink(t, addr); err != nil { // the meta hash went with the flush
		t.Fatal(err)
	}
	if rej, err := s.Apply(t.Context(), batch); err != nil || len(rej) != 0 {
		t.Fatalf("Apply once memory is free = %v, %v", rej, err)
	}
}

// A real replica answers READONLY to every write: an error of that kind,
// never a rejection.
func TestRealReplicaIsReadOnly(t *testing.T) {
	t.Parallel()
	primary := privateServer(t)
	if _, err := privateSink(t, primary); err != nil { // the meta hash, which the replica copies
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(primary)
	replica := privateServer(t, "--replicaof", host, port)
	c := goredis.NewClient(&goredis.Options{Addr: replica})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, _ := c.Info(t.Context(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never synced:\n%s", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, err := privateSink(t, replica)
	if err != nil {
		t.Fatalf("New on a synced replica: %v", err)
	}
	rej, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `{"v":1}`)})
	if len(rej) != 0 || !errors.Is(err, redis.ErrReadOnly) || !goredis.IsReadOnlyError(err) {
		t.Fatalf("Apply on a replica = %v, %v; want an ErrReadOnly error, no rejection", rej, err)
	}
}

// New refuses a real server that may evict any key, naming its policy.
func TestRealEvictingServerRefused(t *testing.T) {
	t.Parallel()
	addr := privateServer(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
	if _, err := privateSink(t, addr); err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("New on an allkeys-lru server = %v; want a refusal naming the policy", err)
	}
}
