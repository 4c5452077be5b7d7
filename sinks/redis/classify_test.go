package redis_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/redis"
)

// fakeServer speaks just enough RESP2 for a sink: it answers the
// handshake, PING, CONFIG GET, the meta hash and the scripts, and answers
// the apply script (EVALSHA, and EVAL after a NOSCRIPT) as onApply says.
// It covers what a real server will not answer on demand (BUSY, no
// answer, a script's own error, NOSCRIPT); a real server out of memory, a
// real replica and a real evicting server are in private_test.go.
type fakeServer struct {
	addr string
	// onApply answers one apply-script call (cmd is EVALSHA or EVAL,
	// records the number of records); "" means: one code 1 per record.
	onApply func(cmd string, records int) string
	policy  string // what CONFIG GET maxmemory-policy answers

	mu    sync.Mutex
	calls []string
}

func newFake(t *testing.T, onApply func(cmd string, records int) string) *fakeServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{addr: l.Addr().String(), onApply: onApply, policy: "noeviction"}
	var wg sync.WaitGroup
	var conns sync.Map
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return f
}

func (f *fakeServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		cmd := strings.ToUpper(args[0])
		f.mu.Lock()
		f.calls = append(f.calls, cmd)
		f.mu.Unlock()
		var reply string
		switch cmd {
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		case "PING":
			reply = "+PONG\r\n"
		case "CONFIG":
			reply = fmt.Sprintf("*2\r\n$16\r\nmaxmemory-policy\r\n$%d\r\n%s\r\n", len(f.policy), f.policy)
		case "HMGET": // live, floor, filling:<ns>
			reply = "*3\r\n$3\r\n0.1\r\n$-1\r\n$-1\r\n"
		case "HGETALL":
			reply = "*0\r\n"
		case "EVALSHA", "EVAL":
			script := args[1]
			n, _ := strconv.Atoi(args[2])
			if cmd == "EVALSHA" && len(args) > 3 && args[3] == "kf:meta" {
				// A control script (the meta hash is its only key): the
				// first EVALSHA is a NOSCRIPT, as on a fresh server.
				reply = "-NOSCRIPT No matching script. Please use EVAL.\r\n"
				break
			}
			if strings.Contains(script, "local ttl") || cmd == "EVALSHA" {
				if reply = f.onApply(cmd, n/2); reply == "" {
					reply = fmt.Sprintf("*%d\r\n%s", n/2, strings.Repeat(":1\r\n", n/2))
				}
				if reply == "hang" {
					time.Sleep(time.Second)
					return
				}
				if reply == "close" {
					return
				}
				break
			}
			reply = "*2\r\n$3\r\n0.1\r\n$-1\r\n" // the init script: the live namespace, no floor
		default:
			reply = "+OK\r\n"
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

func (f *fakeServer) count(cmd string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == cmd {
			n++
		}
	}
	return n
}

func fakeSink(t *testing.T, f *fakeServer) (*redis.Sink, error) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: f.addr, ContextTimeoutEnabled: true, MaxRetries: -1, Protocol: 2, DisableIdentity: true, ReadTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := redis.New(ctx, c, redis.Options{Prefix: "kf:"})
	if err == nil {
		t.Cleanup(s.Close)
	}
	return s, err
}

// TestErrorsAreSinkErrors: what the server answers for the whole sink
// (out of memory, a replica, no answer, a closed connection) is an error
// of the kind it is, never a rejection, and still go-redis's own error
// underneath.
func TestErrorsAreSinkErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		reply string
		kind  error
		is    func(error) bool
	}{
		{"OOM", "-OOM command not allowed when used memory > 'maxmemory'.\r\n", redis.ErrOutOfMemory, goredis.IsOOMError},
		{"READONLY", "-READONLY You can't write against a read only replica.\r\n", redis.ErrReadOnly, goredis.IsReadOnlyError},
		{"BUSY", "-BUSY Redis is busy running a script.\r\n", redis.ErrServer, func(err error) bool { return goredis.HasErrorPrefix(err, "BUSY") }},
		{"a script error", "-ERR user_script:1: Script attempted to access a non local key in a cluster node\r\n", redis.ErrServer, func(err error) bool { var e goredis.Error; return errors.As(err, &e) }},
		{"no answer", "hang", redis.ErrTimeout, func(err error) bool { var e net.Error; return errors.As(err, &e) && e.Timeout() }},
		{"a closed connection", "close", redis.ErrConnection, func(err error) bool { return errors.Is(err, io.EOF) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(string, int) string { return c.reply })
			s, err := fakeSink(t, f)
			if err != nil {
				t.Fatal(err)
			}
			rej, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `1`), rec("b", 2, "")})
			if len(rej) != 0 {
				t.Errorf("rejections %v: a fault of the server parks nothing", rej)
			}
			if !errors.Is(err, c.kind) || !c.is(err) {
				t.Errorf("Apply: %v; want an error of kind %q that is still go-redis's", err, c.kind)
			}
		})
	}
}

// TestNoScriptFallsBackToEval: a server that has no script cached (a
// restart, a failover) is sent EVAL for the calls it refused, in a second
// round trip, and the batch lands.
func TestNoScriptFallsBackToEval(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(cmd string, _ int) string {
		if cmd == "EVALSHA" {
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		}
		return ""
	})
	s, err := fakeSink(t, f)
	if err != nil {
		t.Fatal(err)
	}
	before := f.count("EVAL")
	rej, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`)})
	if err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v", rej, err)
	}
	if f.count("EVAL") != before+1 {
		t.Errorf("EVAL calls %d → %d; want the refused call sent again as EVAL", before, f.count("EVAL"))
	}
}

// TestEvictingServerRefused: a server that may evict any key could evict
// the pointer or a seq the guard needs; New refuses it.
func TestEvictingServerRefused(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(string, int) string { return "" })
	f.policy = "allkeys-lru"
	if _, err := fakeSink(t, f); err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Errorf("New on an allkeys-lru server: %v; want a refusal naming the policy", err)
	}
}
