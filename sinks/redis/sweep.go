package redis

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"
)

// sweepCount is the COUNT of each SCAN step of the collector: how many
// slots of the keyspace one step visits, and so about the most keys one
// UNLINK pipeline removes. Each step is a command of its own, so the server
// serves every other client between two steps.
const sweepCount = 1000

// kickSweep asks the background collector for a pass; passes asked for
// while one runs are one more pass.
func (s *Sink) kickSweep() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// sweeper runs the collector's passes until ctx ends (Close).
func (s *Sink) sweeper(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			_, _ = s.Sweep(ctx) // a failed pass is tried again at the next kick
		}
	}
}

// Sweep removes, now, every key of a namespace under the sink's prefix that
// is neither live nor being filled: the copies publishes replaced, aborted
// and crashed resyncs, and what a late call of a worker that lost its lease
// wrote into one of them. The sink runs it in the background after each
// OpenResync, Publish and Abort and when it starts; it is exported for an
// operator's tool and for tests. It returns how many keys it removed.
//
// It reads the meta hash once, in one command, and then walks the keyspace
// with SCAN MATCH <prefix>[0-9]* in steps of sweepCount (on every master of
// a cluster), UNLINKing what it found in each step before the next: never
// KEYS, and never a step whose cost grows with the keyspace. A namespace
// opened after that read has a higher number than the meta hash's next
// field then held, so a pass never touches a resync that began after it.
// Keys that are not of the sink's layout are left alone. It stops when ctx
// ends.
func (s *Sink) Sweep(ctx context.Context) (int, error) {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	meta, err := s.client.HGetAll(ctx, s.l.meta()).Result()
	if err != nil {
		return 0, classify("reading the meta hash", err)
	}
	next, err := strconv.ParseInt(meta[fieldNext], 10, 64)
	if err != nil {
		return 0, nil // no namespace was ever opened here: nothing can be the sink's
	}
	keep := map[string]bool{meta[fieldLive]: true}
	for f := range meta {
		if ns, ok := strings.CutPrefix(f, fieldFilling); ok {
			keep[ns] = true
		}
	}
	var removed atomic.Int64
	pass := func(ctx context.Context, c goredis.UniversalClient) error {
		var cursor uint64
		for {
			keys, nextCursor, err := c.Scan(ctx, cursor, s.opts.Prefix+"[0-9]*", sweepCount).Result()
			if err != nil {
				return err
			}
			pipe := c.Pipeline()
			n := 0
			for _, k := range keys {
				if ns, num, ok := s.l.parse(k); ok && num <= next && !keep[ns] {
					pipe.Unlink(ctx, k)
					n++
				}
			}
			if n > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				removed.Add(int64(n))
			}
			if cursor = nextCursor; cursor == 0 {
				return nil
			}
		}
	}
	if s.cluster != nil {
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return pass(ctx, c) })
	} else {
		err = pass(ctx, s.client)
	}
	if err != nil {
		return int(removed.Load()), classify("collecting retired copies", err)
	}
	return int(removed.Load()), nil
}
