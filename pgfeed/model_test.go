package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// minModelSteps is how many operations the model test must run in CI.
const minModelSteps = 1000

// leasePair is one lease taken on both stores at the same step.
type leasePair struct {
	mem, pg feed.Lease
}

// model drives pgfeed and memfeed (the oracle) with the same operations on
// the same manual clock and requires the same answer from both.
type model struct {
	ctx    context.Context
	clock  *feedtest.ManualClock
	mem    *memfeed.Store
	pg     *pgfeed.Store
	db     db
	feeds  []feed.FeedName
	sinks  []feed.SinkName
	keys   []feed.Key
	leases map[feed.SinkID][]leasePair // every lease taken, newest last
	live   int                         // leases not yet released: each has one armed heartbeat timer
	// holders maps memfeed's holder ids to pgfeed's, to compare Describe.
	holders map[feed.LeaseHolder]feed.LeaseHolder
	steps   *atomic.Int64
	seen    *outcomes
}

// outcomes counts the answers that show the model reached the interesting
// states: a test whose operations all bounced off empty state proves little.
type outcomes struct {
	casLanded, casRefused, collected, retried, removed, heldRefused, lost atomic.Int64
	// unsealedWrites and sealed count the concurrent write mode's steps:
	// writes that left keys unsealed and rows sealed by rounds.
	unsealedWrites, sealed atomic.Int64
}

func TestModelAgainstMemfeed(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			runModel(t, mode.mode)
		})
	}
}

func runModel(t *testing.T, mode pgx.QueryExecMode) {
	d := setup(t, pgtest.URL(), mode)
	var steps, checks atomic.Int64
	var seen outcomes
	rapid.Check(t, func(rt *rapid.T) {
		n := checks.Add(1)
		clock := feedtest.NewManualClock(time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC))
		mem, err := memfeed.New(memfeed.Options{Lease: feedtest.SuiteLease, Clock: clock})
		if err != nil {
			rt.Fatal(err)
		}
		pg, err := pgfeed.New(context.Background(), d.pool, pgfeed.Options{Schema: d.schema, Lease: feedtest.SuiteLease, Clock: clock})
		if err != nil {
			rt.Fatal(err)
		}
		m := &model{
			ctx: context.Background(), clock: clock, mem: mem, pg: pg, db: d,
			feeds:   []feed.FeedName{feed.FeedName(fmt.Sprintf("m%d-a", n)), feed.FeedName(fmt.Sprintf("m%d-b", n))},
			sinks:   []feed.SinkName{"s1", "s2"},
			keys:    []feed.Key{"k0", "k1", "k2", "k3", "k4"},
			leases:  make(map[feed.SinkID][]leasePair),
			holders: make(map[feed.LeaseHolder]feed.LeaseHolder),
			steps:   &steps,
			seen:    &seen,
		}
		defer m.releaseAll()
		defer pg.Close()
		rt.Repeat(m.actions())
	})
	t.Logf("model: %d checks, %d steps; cas landed %d, refused %d; tombstones collected %d; retries %d; sinks removed %d; leases refused %d; lost %d; unsealed writes %d; rows sealed %d",
		checks.Load(), steps.Load(), seen.casLanded.Load(), seen.casRefused.Load(), seen.collected.Load(), seen.retried.Load(), seen.removed.Load(), seen.heldRefused.Load(), seen.lost.Load(), seen.unsealedWrites.Load(), seen.sealed.Load())
	for name, n := range map[string]int64{"cas landed": seen.casLanded.Load(), "cas refused": seen.casRefused.Load(), "tombstones collected": seen.collected.Load(),
		"retries": seen.retried.Load(), "sinks removed": seen.removed.Load(), "leases refused": seen.heldRefused.Load(), "leases lost": seen.lost.Load(),
		"unsealed writes": seen.unsealedWrites.Load(), "rows sealed": seen.sealed.Load()} {
		if n == 0 && steps.Load() >= minModelSteps {
			t.Errorf("the model never reached %q in %d steps", name, steps.Load())
		}
	}
	if os.Getenv("CI") != "" && steps.Load() < minModelSteps {
		t.Errorf("the model ran %d steps, fewer than the %d CI requires", steps.Load(), minModelSteps)
	}
}

func (m *model) releaseAll() {
	for _, ls := range m.leases {
		for _, l := range ls {
			_ = l.mem.Release(m.ctx)
			_ = l.pg.Release(m.ctx)
		}
	}
}

// pickFeed favours the first feed, so that one feed's sinks, cursors and
// tombstones meet often enough for collection and retries to happen; the
// second feed is there to show that feeds stay independent.
func (m *model) pickFeed(t *rapid.T) feed.FeedName {
	return rapid.SampledFrom([]feed.FeedName{m.feeds[0], m.feeds[0], m.feeds[0], m.feeds[1]}).Draw(t, "feed")
}

func (m *model) id(t *rapid.T) feed.SinkID {
	return feed.SinkID{Feed: m.pickFeed(t), Sink: rapid.SampledFrom(m.sinks).Draw(t, "sink")}
}

// same fails t unless both errors are nil or both carry the same condition.
func same(t *rapid.T, op string, memErr, pgErr error) {
	t.Helper()
	for _, c := range []error{feed.ErrLeaseHeld, feed.ErrLeaseLost, feed.ErrCursorSuperseded, feed.ErrInvalid, feed.ErrUnknownFeed} {
		if errors.Is(memErr, c) != errors.Is(pgErr, c) {
			t.Fatalf("%s: memfeed says %v, pgfeed says %v", op, memErr, pgErr)
		}
	}
	if (memErr == nil) != (pgErr == nil) {
		t.Fatalf("%s: memfeed says %v, pgfeed says %v", op, memErr, pgErr)
	}
}

func (m *model) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"": func(t *rapid.T) { m.steps.Add(1) },
		"write": func(t *rapid.T) {
			f := m.pickFeed(t)
			n := rapid.IntRange(0, 4).Draw(t, "n")
			var changes []feed.Change
			for i := range n {
				k := rapid.SampledFrom(m.keys).Draw(t, fmt.Sprintf("key%d", i))
				if rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("del%d", i)) == 0 {
					changes = append(changes, feed.Delete(k))
				} else {
					v := rapid.IntRange(0, 99).Draw(t, fmt.Sprintf("v%d", i))
					// In jsonb's own text form, so that both stores hand out
					// documents of one length and cut by bytes alike.
					changes = append(changes, feed.Put(k, []byte(fmt.Sprintf(`{"k": "%s", "l": [1, {"x": true}], "v": %d}`, k, v))))
				}
			}
			a, errA := m.mem.WriteCommitted(m.ctx, f, changes)
			b, errB := m.pg.WriteCommitted(m.ctx, f, changes)
			same(t, "write", errA, errB)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("write: memfeed %+v, pgfeed %+v", a, b)
			}
			if len(a.Unsealed) > 0 {
				m.seen.unsealedWrites.Add(1)
			}
		},
		"setMode": func(t *rapid.T) {
			// Feeds move between the write modes, so one sequence meets
			// both, and the moves between them (the one to locked seals).
			f := m.pickFeed(t)
			mode := rapid.SampledFrom([]feed.WriteMode{feed.WriteLocked, feed.WriteConcurrent, feed.WriteConcurrent}).Draw(t, "mode")
			same(t, "setMode "+string(mode), m.mem.SetWriteMode(m.ctx, f, mode), m.pg.SetWriteMode(m.ctx, f, mode))
		},
		"seal": func(t *rapid.T) {
			f := m.pickFeed(t)
			var keys []feed.Key
			for i := range rapid.IntRange(1, 3).Draw(t, "rangeKeys") {
				keys = append(keys, rapid.SampledFrom(m.keys).Draw(t, fmt.Sprintf("rangeKey%d", i)))
			}
			m.sameSealedRange(t, f, keys)
			a, errA := m.mem.SealRound(m.ctx, f)
			b, errB := m.pg.SealRound(m.ctx, f)
			same(t, "seal", errA, errB)
			if a != b {
				t.Fatalf("seal %s: memfeed sealed %d, pgfeed %d", f, a, b)
			}
			m.seen.sealed.Add(int64(a))
			m.sameSealedRange(t, f, keys)
		},
		"readBatch": func(t *rapid.T) {
			f := m.pickFeed(t)
			head, _ := m.mem.Head(m.ctx, f)
			after := feed.Seq(rapid.Int64Range(0, int64(head)+1).Draw(t, "after"))
			limit := feed.BatchLimit{
				Records: rapid.IntRange(1, 6).Draw(t, "limit"),
				Bytes:   rapid.SampledFrom([]int{0, 1, 40, 50, 100, 150, 250}).Draw(t, "bytes"),
			}
			a, errA := m.mem.ReadBatch(m.ctx, f, after, limit)
			b, errB := m.pg.ReadBatch(m.ctx, f, after, limit)
			same(t, "readBatch", errA, errB)
			if a.Generation != b.Generation || a.Head != b.Head || len(a.Records) != len(b.Records) || a.More != b.More {
				t.Fatalf("readBatch(%d, %+v): memfeed %+v, pgfeed %+v", after, limit, a, b)
			}
			for i := range a.Records {
				ra, rb := a.Records[i], b.Records[i]
				if ra.Key != rb.Key || ra.Seq != rb.Seq || !feedtest.JSONEqual(ra.Doc, rb.Doc) {
					t.Fatalf("readBatch record %d: memfeed %s@%d=%s, pgfeed %s@%d=%s", i, ra.Key, ra.Seq, ra.Doc, rb.Key, rb.Seq, rb.Doc)
				}
			}
		},
		"acquire": func(t *rapid.T) {
			id := m.id(t)
			a, errA := m.mem.AcquireLease(m.ctx, id)
			b, errB := m.pg.AcquireLease(m.ctx, id)
			if errA == nil {
				m.live++
			}
			if errB == nil {
				m.live++
			}
			if errA == nil && errB == nil {
				m.leases[id] = append(m.leases[id], leasePair{a, b})
				m.holders[a.Holder()] = b.Holder()
			} else {
				m.discard(a, b)
			}
			same(t, "acquire "+id.String(), errA, errB)
			if errA != nil {
				m.seen.heldRefused.Add(1)
			}
			m.waitArmed(t)
		},
		"release": func(t *rapid.T) {
			id := m.id(t)
			ls := m.leases[id]
			if len(ls) == 0 {
				t.Skip("no lease")
			}
			i := rapid.IntRange(0, len(ls)-1).Draw(t, "lease")
			same(t, "release", ls[i].mem.Release(m.ctx), ls[i].pg.Release(m.ctx))
			m.leases[id] = slices.Delete(ls, i, i+1)
			m.live -= 2
		},
		"ensureHeld": func(t *rapid.T) {
			id := m.id(t)
			ls := m.leases[id]
			if len(ls) == 0 {
				t.Skip("no lease")
			}
			l := rapid.SampledFrom(ls).Draw(t, "lease")
			errA := l.mem.EnsureHeld(m.ctx)
			same(t, "ensureHeld", errA, l.pg.EnsureHeld(m.ctx))
			if errA != nil {
				m.seen.lost.Add(1)
			}
		},
		"skip": func(t *rapid.T) {
			// Time passes with every process frozen: no heartbeat runs, so
			// leases lapse exactly as the model says.
			d := rapid.SampledFrom([]time.Duration{time.Millisecond, time.Second, 10 * time.Second, 20 * time.Second, 31 * time.Second}).Draw(t, "skip")
			m.clock.Skip(d)
		},
		"cas": func(t *rapid.T) {
			id := m.id(t)
			ls := m.leases[id]
			if len(ls) == 0 {
				t.Skip("no lease")
			}
			l := rapid.SampledFrom(ls).Draw(t, "lease")
			cur, _ := m.mem.ReadCursor(m.ctx, id)
			gen, _ := m.mem.Generation(m.ctx, id.Feed)
			head, _ := m.mem.Head(m.ctx, id.Feed)
			expected := cur
			if rapid.IntRange(0, 4).Draw(t, "wrongExpected") == 0 {
				expected = feed.Cursor{Generation: gen, Seq: feed.Seq(rapid.Int64Range(0, int64(head)).Draw(t, "expSeq"))}
			}
			next := feed.Cursor{Generation: gen, Seq: feed.Seq(rapid.Int64Range(int64(cur.Seq), int64(head)).Draw(t, "nextSeq"))}
			// Now and then a place the feed never had: above the head, or
			// of a generation before or after the feed's.
			switch rapid.IntRange(0, 9).Draw(t, "unknownNext") {
			case 0:
				next.Seq = head + feed.Seq(rapid.Int64Range(1, 3).Draw(t, "aboveHead"))
			case 1:
				next.Generation = gen + 1
			case 2:
				next.Generation = max(feed.FirstGeneration, gen-1)
			}
			change := feed.ParkChange{Replace: rapid.IntRange(0, 4).Draw(t, "replace") == 0}
			// Mostly no parks: a key parked anywhere keeps its tombstone, and
			// parks everywhere would leave collection nothing to do.
			for i := range max(0, rapid.IntRange(-4, 2).Draw(t, "parks")) {
				change.Park = append(change.Park, feed.ParkedRecord{
					Key:      rapid.SampledFrom(m.keys).Draw(t, fmt.Sprintf("parkKey%d", i)),
					Seq:      feed.Seq(rapid.Int64Range(1, int64(head)+1).Draw(t, fmt.Sprintf("parkSeq%d", i))),
					Reason:   rapid.SampledFrom([]string{"too big", "bad shape", "ünïcode ✓"}).Draw(t, fmt.Sprintf("reason%d", i)),
					ParkedAt: m.clock.Now(),
				})
			}
			for i := range rapid.IntRange(0, 2).Draw(t, "unparks") {
				change.Unpark = append(change.Unpark, rapid.SampledFrom(m.keys).Draw(t, fmt.Sprintf("unpark%d", i)))
			}
			mv := feed.CursorMove{ID: id, Expected: expected, Next: next, Parked: change}
			mv.Holder = l.mem.Holder()
			errA := m.mem.CASCursor(m.ctx, mv)
			mv.Holder = l.pg.Holder()
			errB := m.pg.CASCursor(m.ctx, mv)
			same(t, "cas", errA, errB)
			var supA, supB *feed.CursorSupersededError
			var invA, invB *feed.InvalidError
			if (errors.As(errA, &supA) && errors.As(errB, &supB) && supA.Generation != supB.Generation) ||
				(errors.As(errA, &invA) && errors.As(errB, &invB) && invA.Field != invB.Field) {
				t.Fatalf("cas: memfeed says %v, pgfeed says %v", errA, errB)
			}
			if errA == nil {
				m.seen.casLanded.Add(1)
			} else {
				m.seen.casRefused.Add(1)
			}
		},
		"catchUp": func(t *rapid.T) {
			// A worker's ordinary step: move the cursor from where it is to
			// the head, with nothing parked.
			id := m.id(t)
			ls := m.leases[id]
			if len(ls) == 0 {
				t.Skip("no lease")
			}
			l := ls[len(ls)-1]
			cur, _ := m.mem.ReadCursor(m.ctx, id)
			gen, _ := m.mem.Generation(m.ctx, id.Feed)
			head, _ := m.mem.Head(m.ctx, id.Feed)
			mv := feed.CursorMove{ID: id, Holder: l.mem.Holder(), Expected: cur, Next: feed.Cursor{Generation: gen, Seq: head}}
			errA := m.mem.CASCursor(m.ctx, mv)
			mv.Holder = l.pg.Holder()
			same(t, "catchUp", errA, m.pg.CASCursor(m.ctx, mv))
			if errA == nil {
				m.seen.casLanded.Add(1)
			} else {
				m.seen.casRefused.Add(1)
			}
		},
		"readParked": func(t *rapid.T) {
			id := m.id(t)
			a, errA := m.mem.ReadParked(m.ctx, id)
			b, errB := m.pg.ReadParked(m.ctx, id)
			same(t, "readParked", errA, errB)
			if !sameParked(a, b) {
				t.Fatalf("readParked: memfeed %+v, pgfeed %+v", a, b)
			}
		},
		"readCursor": func(t *rapid.T) {
			id := m.id(t)
			a, errA := m.mem.ReadCursor(m.ctx, id)
			b, errB := m.pg.ReadCursor(m.ctx, id)
			same(t, "readCursor", errA, errB)
			if a != b {
				t.Fatalf("readCursor: memfeed %v, pgfeed %v", a, b)
			}
		},
		"retry": func(t *rapid.T) {
			id := m.id(t)
			k := rapid.SampledFrom(m.keys).Draw(t, "key")
			a, errA := m.mem.RetryParked(m.ctx, id, k)
			b, errB := m.pg.RetryParked(m.ctx, id, k)
			same(t, "retry", errA, errB)
			if a != b {
				t.Fatalf("retry %s %s: memfeed %v, pgfeed %v", id, k, a, b)
			}
			if a {
				m.seen.retried.Add(1)
			}
		},
		"collect": func(t *rapid.T) {
			f := m.pickFeed(t)
			a, errA := m.mem.CollectTombstones(m.ctx, f)
			b, errB := m.pg.CollectTombstones(m.ctx, f)
			same(t, "collect", errA, errB)
			if a != b {
				t.Fatalf("collect %s: memfeed %d, pgfeed %d", f, a, b)
			}
			m.seen.collected.Add(int64(a))
		},
		"removeSink": func(t *rapid.T) {
			id := m.id(t)
			a, errA := m.mem.RemoveSink(m.ctx, id)
			b, errB := m.pg.RemoveSink(m.ctx, id)
			same(t, "removeSink", errA, errB)
			if a != b {
				t.Fatalf("removeSink %s: memfeed %v, pgfeed %v", id, a, b)
			}
			if a {
				m.seen.removed.Add(1)
			}
		},
		"rebuild": func(t *rapid.T) {
			f := m.pickFeed(t)
			tx := m.mem.Begin()
			a, errA := tx.ResetFeed(m.ctx, f)
			if errA == nil {
				errA = tx.Commit()
			}
			tx.Rollback()
			var b feed.Generation
			errB := pgx.BeginFunc(m.ctx, m.db.pool, func(tx pgx.Tx) error {
				var err error
				b, err = m.pg.ResetTx(m.ctx, tx, f)
				return err
			})
			same(t, "rebuild", errA, errB)
			if a != b {
				t.Fatalf("rebuild %s: memfeed %d, pgfeed %d", f, a, b)
			}
		},
		"describe": func(t *rapid.T) {
			f := m.pickFeed(t)
			a, errA := m.mem.Describe(m.ctx, f)
			b, errB := m.pg.Describe(m.ctx, f)
			same(t, "describe", errA, errB)
			if msg := m.sameDescription(a, b); msg != "" {
				t.Fatalf("describe %s: %s\nmemfeed %+v\npgfeed  %+v", f, msg, a, b)
			}
		},
	}
}

// sameSealedRange fails t unless both stores say the same of keys' seal.
func (m *model) sameSealedRange(t *rapid.T, f feed.FeedName, keys []feed.Key) {
	t.Helper()
	ga, fa, la, sa, errA := m.mem.SealedRange(m.ctx, f, keys)
	gb, fb, lb, sb, errB := m.pg.SealedRange(m.ctx, f, keys)
	same(t, "sealedRange", errA, errB)
	if ga != gb || fa != fb || la != lb || sa != sb {
		t.Fatalf("sealedRange %s %v: memfeed %d %d..%d %v, pgfeed %d %d..%d %v", f, keys, ga, fa, la, sa, gb, fb, lb, sb)
	}
}

// discard releases the half of a lease pair that one store granted when the
// other refused; the comparison that follows then fails the check.
func (m *model) discard(a, b feed.Lease) {
	for _, l := range []feed.Lease{a, b} {
		if l != nil {
			_ = l.Release(m.ctx)
			m.live--
		}
	}
}

// waitArmed waits until every live lease's heartbeat has armed its timer, so
// the next Skip freezes all of them alike.
func (m *model) waitArmed(t *rapid.T) {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	if err := m.clock.WaitForTimers(ctx, m.live); err != nil {
		t.Fatal(err)
	}
}

func sameParked(a, b []feed.ParkedRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Seq != b[i].Seq || a[i].Reason != b[i].Reason || !a[i].ParkedAt.Equal(b[i].ParkedAt) {
			return false
		}
	}
	return true
}

func (m *model) sameDescription(a, b feed.Description) string {
	if a.Feed != b.Feed || a.Generation != b.Generation || a.Head != b.Head || len(a.Sinks) != len(b.Sinks) {
		return "feed, generation, head or sink count differ"
	}
	if a.Mode != b.Mode || a.Unsealed != b.Unsealed || (a.Sealer == nil) != (b.Sealer == nil) {
		return "mode, unsealed backlog or sealer lease differ"
	}
	for i := range a.Sinks {
		sa, sb := a.Sinks[i], b.Sinks[i]
		if sa.Sink != sb.Sink || sa.Cursor != sb.Cursor || !sa.LastAdvance.Equal(sb.LastAdvance) || sa.Pending != sb.Pending {
			return fmt.Sprintf("sink %d differs", i)
		}
		if (sa.Lease == nil) != (sb.Lease == nil) {
			return fmt.Sprintf("sink %s: lease recorded on one store only", sa.Sink)
		}
		if sa.Lease != nil && (m.holders[sa.Lease.Holder] != sb.Lease.Holder || !sa.Lease.ExpiresAt.Equal(sb.Lease.ExpiresAt)) {
			return fmt.Sprintf("sink %s: lease %+v vs %+v", sa.Sink, *sa.Lease, *sb.Lease)
		}
		if !sameParked(sa.Parked, sb.Parked) {
			return fmt.Sprintf("sink %s: parked differ", sa.Sink)
		}
	}
	return ""
}
