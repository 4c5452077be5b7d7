package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// proxy is one toxiproxy proxy, run in this process, between a client under
// test and a real server on 127.0.0.1. Toxics are added and removed while
// connections are open; they apply to the connections already there as well
// as to new ones.
type proxy struct {
	t    testing.TB
	p    *toxiproxy.Proxy
	addr string // where clients connect
}

var proxyCount atomic.Int64

// newProxy starts a proxy in front of upstream (host:port), stopped at
// cleanup.
func newProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, fmt.Sprintf("p%d", proxyCount.Add(1)), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("starting a proxy in front of %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &proxy{t: t, p: p, addr: p.Listen}
}

// toxic adds a toxic of typ on stream ("upstream": client to server,
// "downstream": server to client) under name, with attrs as its attributes.
func (p *proxy) toxic(name, typ, stream string, attrs map[string]any) {
	p.t.Helper()
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
		p.t.Fatalf("adding toxic %s (%s on %s): %v", name, typ, stream, err)
	}
}

// remove takes the toxic name away; the data it held back flows again.
func (p *proxy) remove(name string) {
	p.t.Helper()
	if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.t.Fatalf("removing toxic %s: %v", name, err)
	}
}

// blackHole stops every byte both ways on every connection, new ones
// included: a partition as a client sees it. With closeAfter zero nothing is
// ever closed (only a client that gives up and closes its end ends a
// connection, and the proxy then closes the server's end too); otherwise a
// connection that has carried nothing for closeAfter is closed, as a TCP
// stack does once its retransmissions or keepalives give up.
func (p *proxy) blackHole(closeAfter time.Duration) {
	p.toxic("hole_up", "timeout", "upstream", map[string]any{"timeout": closeAfter.Milliseconds()})
	p.toxic("hole_down", "timeout", "downstream", map[string]any{"timeout": closeAfter.Milliseconds()})
}

// heal removes the black hole.
func (p *proxy) heal() {
	p.remove("hole_up")
	p.remove("hole_down")
}

// ---------------------------------------------------------------------------
// lose_reply: a toxic of our own, for the commit whose answer is lost.

// loseReply is a downstream toxic: it forwards the server's replies until one
// matches its cutter and the cutter still has cuts left; that reply is
// dropped and the client's connection closed. The server has by then run the
// statement to its end (the reply is its answer), so the client sees a failed
// call whose effect landed. Toxiproxy builds toxics by type from JSON, so the
// cutter is found by name in a registry.
type loseReply struct {
	Cutter string `json:"cutter"`
}

// cutter says which replies to lose, and how many more.
type cutter struct {
	match func(reply []byte) bool
	left  atomic.Int32 // cuts still to make
	made  atomic.Int32 // cuts made
}

// take uses up one cut, if one is left.
func (c *cutter) take() bool {
	for {
		n := c.left.Load()
		if n <= 0 {
			return false
		}
		if c.left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

var (
	cuttersMu sync.Mutex
	cutters   = map[string]*cutter{}
	cutterSeq atomic.Int64
)

func init() {
	toxics.Register("lose_reply", new(loseReply))
	toxics.Register("swallow_reply", new(swallowReply))
}

// loseReplies adds a lose_reply toxic that cuts the connection in place of
// each reply match recognises, once armed (cutter.left).
func (p *proxy) loseReplies(match func([]byte) bool) *cutter {
	p.t.Helper()
	return p.cutReplies("lose_reply", match)
}

// swallowReplies adds a swallow_reply toxic: each reply match recognises,
// once armed, never reaches the client, and neither does anything after it
// on that connection, which stays open.
func (p *proxy) swallowReplies(match func([]byte) bool) *cutter {
	p.t.Helper()
	return p.cutReplies("swallow_reply", match)
}

// cutReplies adds a downstream toxic of typ driven by a new cutter.
func (p *proxy) cutReplies(typ string, match func([]byte) bool) *cutter {
	p.t.Helper()
	c := &cutter{match: match}
	name := fmt.Sprintf("cut%d", cutterSeq.Add(1))
	cuttersMu.Lock()
	cutters[name] = c
	cuttersMu.Unlock()
	p.t.Cleanup(func() {
		cuttersMu.Lock()
		delete(cutters, name)
		cuttersMu.Unlock()
	})
	p.toxic(name, typ, "downstream", map[string]any{"cutter": name})
	return c
}

// swallowReply is a downstream toxic like loseReply, but it leaves the
// connection open: the reply it matches, and all that follows on that
// connection, goes nowhere, as when a reply is lost on a connection TCP still
// thinks alive. Only the client giving up and closing its end ends it.
type swallowReply struct {
	Cutter string `json:"cutter"`
}

func (t *swallowReply) Pipe(stub *toxics.ToxicStub) {
	cuttersMu.Lock()
	c := cutters[t.Cutter]
	cuttersMu.Unlock()
	swallowing := false
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			if !swallowing && c != nil && c.left.Load() > 0 && c.match(chunk.Data) && c.take() {
				c.made.Add(1)
				swallowing = true
			}
			if swallowing {
				continue
			}
			if err := stub.WriteOutput(chunk, 10*time.Second); err != nil {
				stub.Close()
				return
			}
		}
	}
}

func (t *loseReply) Pipe(stub *toxics.ToxicStub) {
	cuttersMu.Lock()
	c := cutters[t.Cutter]
	cuttersMu.Unlock()
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			if c != nil && c.left.Load() > 0 && c.match(chunk.Data) && c.take() {
				c.made.Add(1)
				stub.Close() // the client's connection ends; this reply never reaches it
				for {        // what else the server sends goes nowhere
					select {
					case <-stub.Interrupt:
						return
					case more := <-stub.Input:
						if more == nil {
							return
						}
					}
				}
			}
			if err := stub.WriteOutput(chunk, 10*time.Second); err != nil {
				stub.Close()
				return
			}
		}
	}
}

// pgCommitReply recognises PostgreSQL's answer to COMMIT: a CommandComplete
// message whose tag is COMMIT. A transaction that failed answers ROLLBACK
// instead, so this reply means the commit is durable.
func pgCommitReply(b []byte) bool {
	return bytes.Contains(b, []byte("C\x00\x00\x00\x0bCOMMIT\x00"))
}

// pgInsertOneReply recognises the CommandComplete of an INSERT of one row.
func pgInsertOneReply(b []byte) bool {
	return bytes.Contains(b, []byte("C\x00\x00\x00\x0fINSERT 0 1\x00"))
}

// pgRowDescription recognises the reply of a statement (simple protocol, so
// every reply carries its RowDescription) whose result columns are named
// cols, in that order.
func pgRowDescription(cols ...string) func([]byte) bool {
	return func(b []byte) bool {
		i := bytes.IndexByte(b, 'T')
		for i >= 0 && i+7 <= len(b) {
			if n := int(b[i+5])<<8 | int(b[i+6]); n == len(cols) {
				rest := b[i+7:]
				ok := true
				for _, c := range cols {
					if !bytes.HasPrefix(rest, append([]byte(c), 0)) || len(rest) < len(c)+1+18 {
						ok = false
						break
					}
					rest = rest[len(c)+1+18:] // name, NUL, then 18 bytes of field attributes
				}
				if ok {
					return true
				}
			}
			j := bytes.IndexByte(b[i+1:], 'T')
			if j < 0 {
				return false
			}
			i += 1 + j
		}
		return false
	}
}
