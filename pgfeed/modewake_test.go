package pgfeed_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// switchPrompt bounds how long a write after a switch to the concurrent
// mode may take to reach a running runner's sink. The mode check is an hour
// here, so only the switch's notification can make it.
const switchPrompt = 5 * time.Second

// TestModeSwitchWakesRunner: a syncer.Runner runs on a feed in the locked
// mode, its sealer's mode check an hour away. A switch to the concurrent
// mode wakes the sealer through the switch's notification, so the next
// write reaches the sink within seconds; a switch back to the locked mode
// leaves nothing unsealed, the sealer gives its lease up, and the locked
// write after it reaches the sink; a second switch to the concurrent mode
// wakes the sealer again. It runs on a direct pool, and through PgBouncer
// in transaction mode with the listener on a direct connection, as the
// package doc advises behind a pooler.
func TestModeSwitchWakesRunner(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		modeSwitchWakes(t, setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement), nil)
	})
	t.Run("pgbouncer", func(t *testing.T) {
		t.Parallel()
		modeSwitchWakes(t, setup(t, pgbouncerURL(t), pgx.QueryExecModeSimpleProtocol), directListen)
	})
}

func modeSwitchWakes(t *testing.T, d db, listen func(context.Context) (*pgx.Conn, error)) {
	s := newStore(t, d, pgfeed.Options{Listen: listen, Sealer: pgfeed.SealerOptions{ModeCheck: time.Hour}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const f = feed.FeedName("switched")
	sink := memfeed.NewSink(memfeed.SinkOptions{})
	id := feed.SinkID{Feed: f, Sink: "mem"}
	write := func(k feed.Key, v int) feed.WriteResult {
		t.Helper()
		res, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put(k, []byte(fmt.Sprint(v)))})
		if err != nil {
			t.Fatalf("write %s: %v", k, err)
		}
		return res
	}
	reaches := func(k feed.Key, v int, within time.Duration) {
		t.Helper()
		start := time.Now()
		for string(sink.Documents()[k]) != fmt.Sprint(v) {
			if time.Since(start) > within {
				desc, _ := s.Describe(ctx, f)
				t.Fatalf("%s = %d not in the sink %v after it was written (mode %s, %d unsealed)", k, v, within, desc.Mode, desc.Unsealed)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%s reached the sink in %v", k, time.Since(start).Round(time.Millisecond))
	}
	setMode := func(m feed.WriteMode) {
		t.Helper()
		if err := s.SetWriteMode(ctx, f, m); err != nil {
			t.Fatalf("SetWriteMode(%s): %v", m, err)
		}
	}

	write("locked", 1) // the feed is recorded, in the locked mode
	r, err := syncer.NewRunner(s, []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	reaches("locked", 1, switchPrompt)
	// The sealer has probed by now and found the feed locked; without the
	// notification it would look again only in an hour.
	time.Sleep(300 * time.Millisecond)

	setMode(feed.WriteConcurrent)
	if res := write("first", 1); len(res.Unsealed) != 1 {
		t.Fatalf("write after the switch = %+v; want it unsealed", res)
	}
	reaches("first", 1, switchPrompt)

	// Back to the locked mode, with writes unsealed or not yet: the switch
	// seals them, and the sealer lets its lease go at its next probe.
	for i := range 20 {
		write(feed.Key(fmt.Sprintf("burst%d", i)), i)
	}
	setMode(feed.WriteLocked)
	if desc, err := s.Describe(ctx, f); err != nil || desc.Unsealed != 0 || desc.Mode != feed.WriteLocked {
		t.Fatalf("after the switch to the locked mode: %+v, %v; want no row unsealed", desc, err)
	}
	if res := write("relocked", 2); res.First == 0 {
		t.Fatalf("write in the locked mode again = %+v; want its seq", res)
	}
	reaches("relocked", 2, switchPrompt)
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		desc, err := s.Describe(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if desc.Sealer == nil || desc.Sealer.Holder == "" {
			break
		}
		if time.Since(start) > switchPrompt {
			t.Fatalf("the sealer still holds its lease %v after the switch to the locked mode: %+v", switchPrompt, desc.Sealer)
		}
	}
	time.Sleep(300 * time.Millisecond) // the sealer waits on the locked feed again

	setMode(feed.WriteConcurrent)
	write("second", 3)
	reaches("second", 3, switchPrompt)
	for i := range 20 {
		if got := string(sink.Documents()[feed.Key(fmt.Sprintf("burst%d", i))]); got != fmt.Sprint(i) {
			t.Fatalf("burst%d is %q in the sink, want %d", i, got, i)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestModeSwitchFallsBackToModeCheck: behind a transaction pooler with no
// direct listener no notification arrives (the listener warns), and a
// sealer on a locked feed sees a switch at its next mode check, which still
// bounds the wait.
func TestModeSwitchFallsBackToModeCheck(t *testing.T) {
	t.Parallel()
	d := setup(t, pgbouncerURL(t), pgx.QueryExecModeSimpleProtocol)
	const check = 500 * time.Millisecond
	s := newStore(t, d, pgfeed.Options{Sealer: pgfeed.SealerOptions{ModeCheck: check}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const f = feed.FeedName("fallback")
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("locked", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RunSealer(ctx, f) }()
	time.Sleep(300 * time.Millisecond) // the sealer found the feed locked
	if err := s.SetWriteMode(ctx, f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("after", []byte(`2`))}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		desc, err := s.Describe(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if desc.Unsealed == 0 {
			break
		}
		if time.Since(start) > 10*check {
			t.Fatalf("the write after the switch is still unsealed %v later, with a mode check of %v", time.Since(start), check)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
