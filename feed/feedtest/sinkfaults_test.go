package feedtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

// RunSink proves a sink conforms only if it can fail. faultySink is a correct
// map sink that can be broken one rule at a time; RunSink runs against each
// broken form in a child process and must fail there, in the subtest that
// covers the rule; against the correct form it must pass.

const sinkFaultEnv = "KAIROS_FEEDTEST_SINK_FAULT"

var sinkFaults = map[string]string{ // fault → the subtest that must catch it
	"deleteIgnored":      "Delete",
	"resyncInPlace":      "ResyncInvisibleUntilPublish",
	"publishMerges":      "ResyncInvisibleUntilPublish",
	"abortPublishes":     "AbortKeepsLive",
	"unconditional":      "ConditionalOnSeq",
	"rejectionAsError":   "Rejection",
	"acceptsGeneration0": "BadInput",
}

type faultySink struct {
	fault string
	mu    sync.Mutex
	live  map[feed.Key]entry
}

type entry struct {
	seq feed.Seq
	doc json.RawMessage
}

const rejectKey = "refuse me"

func (s *faultySink) apply(m map[feed.Key]entry, records []feed.Record) ([]feed.Rejection, error) {
	var rej []feed.Rejection
	for _, r := range records {
		if r.Key == rejectKey {
			if s.fault == "rejectionAsError" {
				return nil, errors.New("the sink is down")
			}
			rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "refused"})
			continue
		}
		if old, ok := m[r.Key]; ok && old.seq > r.Seq && s.fault != "unconditional" {
			continue
		}
		if r.Doc == nil && s.fault == "deleteIgnored" {
			continue
		}
		m[r.Key] = entry{r.Seq, r.Doc}
	}
	return rej, nil
}

func (s *faultySink) Apply(_ context.Context, records []feed.Record) ([]feed.Rejection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apply(s.live, records)
}

func (s *faultySink) OpenResync(_ context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	if g < 1 && s.fault != "acceptsGeneration0" {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", g)
	}
	return &faultyResync{s: s, m: map[feed.Key]entry{}}, nil
}

func (s *faultySink) contents(context.Context) (map[feed.Key]json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, e := range s.live {
		if e.doc != nil {
			out[k] = e.doc
		}
	}
	return out, nil
}

type faultyResync struct {
	s *faultySink
	m map[feed.Key]entry
}

func (r *faultyResync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if r.s.fault == "resyncInPlace" {
		return r.s.Apply(ctx, records)
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.s.apply(r.m, records)
}

func (r *faultyResync) Publish(context.Context) error {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	switch r.s.fault {
	case "resyncInPlace":
	case "publishMerges":
		maps.Copy(r.s.live, r.m)
	default:
		r.s.live = r.m
	}
	return nil
}

func (r *faultyResync) Abort(ctx context.Context) error {
	if r.s.fault == "abortPublishes" {
		return r.Publish(ctx)
	}
	return nil
}

// TestRunSinkOnFault is the child: RunSink against the fault named in the
// environment ("none" for the correct sink). It skips when run directly.
func TestRunSinkOnFault(t *testing.T) {
	fault := os.Getenv(sinkFaultEnv)
	if fault == "" {
		t.Skip("runs only as a child of TestRunSinkFailsOnFaultySinks")
	}
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		s := &faultySink{fault: fault, live: map[feed.Key]entry{}}
		return feedtest.SinkHarness{Sink: s, Contents: s.contents, ConditionalOnSeq: true, RejectKey: rejectKey}
	})
}

var sinkFailLine = regexp.MustCompile(`(?m)^\s*--- FAIL: TestRunSinkOnFault/(\S+) \(`)

func TestRunSinkFailsOnFaultySinks(t *testing.T) {
	if os.Getenv(sinkFaultEnv) != "" {
		t.Skip("a child runs only TestRunSinkOnFault")
	}
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	child := func(t *testing.T, fault string) (string, bool) {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestRunSinkOnFault$", "-test.v=true", "-test.count=1", "-test.timeout=1m")
		cmd.Env = append(os.Environ(), sinkFaultEnv+"="+fault)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("running the child: %v", err)
		}
		return string(out), err == nil
	}
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		if out, passed := child(t, "none"); !passed || !strings.Contains(out, "--- PASS: TestRunSinkOnFault ") {
			t.Fatalf("RunSink fails on the correct sink:\n%s", out)
		}
	})
	for fault, caughtBy := range sinkFaults {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			out, passed := child(t, fault)
			if passed {
				t.Fatalf("RunSink passes on a sink with fault %s:\n%s", fault, out)
			}
			var failed []string
			for _, m := range sinkFailLine.FindAllStringSubmatch(out, -1) {
				failed = append(failed, m[1])
			}
			if !slices.Contains(failed, caughtBy) {
				t.Fatalf("fault %s: %s did not fail (failed: %v):\n%s", fault, caughtBy, failed, out)
			}
		})
	}
}
