package memfeed

import (
	"context"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

// The suites in feedtest prove a store conforms only if they can fail. These
// tests show they do: each broken variant is this store with one fault of
// faultSet switched on, the suites are run against it in a child process (a
// failing suite would otherwise fail this test), and the child must fail, in
// the subtest that covers the broken guarantee. The same child with no fault
// must pass, so a child that fails for any other reason is caught too.

// brokenVariantEnv names the variant a child process runs the suites against.
const brokenVariantEnv = "KAIROS_MEMFEED_BROKEN_VARIANT"

type brokenVariant struct {
	fault    string // the faultSet field
	set      func(*faultSet)
	caughtBy string // the child's subtest that must fail
}

// brokenVariants are the faults, each with the subtest (under the child test)
// that must catch it.
var brokenVariants = []brokenVariant{
	{"casIgnoresHolder", func(f *faultSet) { f.casIgnoresHolder = true }, "RunSyncStore/CASWrongHolder"},
	{"casIgnoresExpected", func(f *faultSet) { f.casIgnoresExpected = true }, "RunSyncStore/CASExpectedMismatch"},
	{"parkSurvivesRefusedCAS", func(f *faultSet) { f.parkSurvivesRefusedCAS = true }, "RunSyncStore/RefusedCASChangesNothing"},
	{"collectIgnoresCursorless", func(f *faultSet) { f.collectIgnoresCursorless = true }, "RunSyncStore/CollectTombstones"},
	{"collectIgnoresParked", func(f *faultSet) { f.collectIgnoresParked = true }, "RunSyncStore/CollectKeepsParked"},
	{"leaseTakesLive", func(f *faultSet) { f.leaseTakesLive = true }, "RunSyncStore/LeaseHeld"},
	{"ensureHeldIgnoresMargin", func(f *faultSet) { f.ensureHeldIgnoresMargin = true }, "RunSyncStore/EnsureHeldMargin"},
	{"retryKeepsSeq", func(f *faultSet) { f.retryKeepsSeq = true }, "RunSyncStore/RetryParked"},
	{"readSkipsGeneration", func(f *faultSet) { f.readSkipsGeneration = true }, "RunFeed/Rebuild"},
	{"writeSkipsFeedLock", func(f *faultSet) { f.writeSkipsFeedLock = true }, "RunFeed/ConcurrentWritersCommitOrder"},
	{"casTrustsNext", func(f *faultSet) { f.casTrustsNext = true }, "RunSyncStore/CASRefusesUnknownNext"},
	{"moveWakesNobody", func(f *faultSet) { f.moveWakesNobody = true }, "RunSyncStore/CursorWake"},
	{"collectIgnoresPending", func(f *faultSet) { f.collectIgnoresPending = true }, "RunSyncStore/Concurrent/CollectKeepsUnsealedPut"},
	{"resetKeepsUnsealed", func(f *faultSet) { f.resetKeepsUnsealed = true }, "RunFeed/Concurrent/RebuildDropsUnsealed"},
}

// noFault is the variant name of the store as shipped.
const noFault = "none"

// TestSuitesOnVariant is the child: it runs the suites against the variant
// named in the environment, and skips when run directly.
func TestSuitesOnVariant(t *testing.T) {
	name := os.Getenv(brokenVariantEnv)
	if name == "" {
		t.Skip("runs only as a child of TestBrokenVariantsFailTheSuites")
	}
	var faults faultSet
	if name != noFault {
		i := slices.IndexFunc(brokenVariants, func(v brokenVariant) bool { return v.fault == name })
		if i < 0 {
			t.Fatalf("no broken variant %q", name)
		}
		brokenVariants[i].set(&faults)
	}
	newStore := func(t *testing.T, opts feedtest.StoreOptions) feedtest.StoreHarness {
		s, err := New(Options{Lease: opts.Lease, Clock: opts.Clock})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		s.faults = faults
		return feedtest.StoreHarness{
			Store:  s,
			Reader: s,
			Write: func(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
				tx := s.Begin()
				defer tx.Rollback()
				res, err := s.Write(ctx, tx, f, changes)
				if err != nil {
					return res, err
				}
				// Between a write and its commit a database transaction
				// waits for a round trip; let other writers run here too.
				runtime.Gosched()
				return res, tx.Commit()
			},
			Rebuild: func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
				tx := s.Begin()
				defer tx.Rollback()
				g, err := tx.ResetFeed(ctx, f)
				if err != nil {
					return 0, err
				}
				return g, tx.Commit()
			},
			SetMode: s.SetWriteMode,
			Seal:    s.SealRound,
		}
	}
	t.Run("RunFeed", func(t *testing.T) { feedtest.RunFeed(t, newStore) })
	t.Run("RunSyncStore", func(t *testing.T) { feedtest.RunSyncStore(t, newStore) })
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: TestSuitesOnVariant/(\S+) \(`)

func TestBrokenVariantsFailTheSuites(t *testing.T) {
	if os.Getenv(brokenVariantEnv) != "" {
		t.Skip("a child runs only TestSuitesOnVariant")
	}
	if testing.Short() {
		t.Skip("runs the suites in child processes")
	}
	// Every fault the store has must have a variant here.
	ft := reflect.TypeFor[faultSet]()
	for i := range ft.NumField() {
		name := ft.Field(i).Name
		if !slices.ContainsFunc(brokenVariants, func(v brokenVariant) bool { return v.fault == name }) {
			t.Errorf("faultSet.%s has no broken variant", name)
		}
	}

	child := func(t *testing.T, variant string) (string, bool) {
		cmd := exec.CommandContext(t.Context(), os.Args[0],
			"-test.run=^TestSuitesOnVariant$", "-test.v=true", "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), brokenVariantEnv+"="+variant)
		out, err := cmd.CombinedOutput()
		if err != nil {
			if _, exited := err.(*exec.ExitError); !exited {
				t.Fatalf("running the child: %v", err)
			}
		}
		return string(out), err == nil
	}

	t.Run(noFault, func(t *testing.T) {
		t.Parallel()
		out, passed := child(t, noFault)
		if !passed || !strings.Contains(out, "--- PASS: TestSuitesOnVariant ") {
			t.Fatalf("the suites fail on the store with no fault:\n%s", out)
		}
	})
	for _, v := range brokenVariants {
		t.Run(v.fault, func(t *testing.T) {
			t.Parallel()
			out, passed := child(t, v.fault)
			if passed {
				t.Fatalf("the suites pass on a store with fault %s:\n%s", v.fault, out)
			}
			var failed []string
			for _, m := range failLine.FindAllStringSubmatch(out, -1) {
				failed = append(failed, m[1])
			}
			if !slices.Contains(failed, v.caughtBy) {
				t.Fatalf("fault %s: %s did not fail (failed: %v):\n%s", v.fault, v.caughtBy, failed, out)
			}
			t.Logf("fault %s failed %v", v.fault, failed)
		})
	}
}
