package feedtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

// RunSink proves a sink conforms only if it can fail. faultySink is a correct
// map sink that can be broken one rule at a time; RunSink runs against each
// broken form in a child process and must fail there, in the subtest that
// covers the rule; against the correct form it must pass.

const sinkFaultEnv = "KAIROS_FEEDTEST_SINK_FAULT"

var sinkFaults = map[string]string{ // fault → the subtest that must catch it
	"deleteIgnored":       "Delete",
	"resyncInPlace":       "ResyncInvisibleUntilPublish",
	"publishMerges":       "ResyncInvisibleUntilPublish",
	"abortPublishes":      "AbortKeepsLive",
	"abortLeaks":          "AbortKeepsLive",
	"unconditional":       "ConditionalOnSeq",
	"rejectionAsError":    "Rejection",
	"acceptsGeneration0":  "BadInput",
	"truncatesLongKeys":   "AwkwardKeys",
	"unescapesKeys":       "AwkwardKeys",
	"foldsCase":           "AwkwardKeys",
	"trimsSpace":          "AwkwardKeys",
	"asciiOnly":           "Documents",
	"truncatesLargeDocs":  "Documents",
	"decodesFloat64":      "NumericEdges",
	"oversizeAsError":     "OversizedDocument",
	"rejectsAtLimit":      "OversizedDocument",
	"faultAsRejection":    "FaultIsError",
	"dedupeBeforeSend":    "FaultIsError",
	"publishKeyByKey":     "PublishAtomic",
	"crashLeaks":          "ResyncAfterCrash",
	"forgetsTombstoneSeq": "ConditionalOnSeqAfterDelete",
	"checkThenWrite":      "ConcurrentApply",
	"noFloor":             "StaleGenerationAfterPublish",
	"ignoresSetFloor":     "StaleGenerationAfterEmptyPublish",
	"noFloorSetter":       "StaleGenerationAfterEmptyPublish",
}

// faultySink is one process's handle on a mapTarget; Reopen gives another
// handle on the same target, as a restarted process would get.
type faultySink struct {
	fault string
	t     *mapTarget
}

// mapTarget is what a real sink's server holds: the live copy, the resync
// copies by generation, whether the server is reachable.
type mapTarget struct {
	mu      sync.Mutex
	live    map[feed.Key]entry
	floor   feed.Seq // the live copy's: the floor of the copy published last
	shadows map[feed.Generation]*shadow
	down    bool
	sent    map[feed.Key]feed.Seq // dedupeBeforeSend's memory of what it sent
}

type shadow struct {
	m       map[feed.Key]entry
	floor   feed.Seq // set by the copy's first non-empty Apply, or SetFloor
	aborted bool
}

type entry struct {
	seq feed.Seq
	doc json.RawMessage
}

const (
	rejectKey      = "refuse me"
	maxDocument    = 4 << 20
	longKeyCutsOff = 255 // a VARCHAR(255) key column
)

var errDown = errors.New("the sink's server is unreachable")

func newFaultySink(fault string) *faultySink {
	return &faultySink{fault: fault, t: &mapTarget{
		live:    map[feed.Key]entry{},
		shadows: map[feed.Generation]*shadow{},
		sent:    map[feed.Key]feed.Seq{},
	}}
}

// prepare is a record as the broken sink would store it: its key and
// document transformed, or a rejection, or an error for the whole call.
func (s *faultySink) prepare(r feed.Record) (feed.Key, json.RawMessage, *feed.Rejection, error) {
	reject := func(reason string) (feed.Key, json.RawMessage, *feed.Rejection, error) {
		return "", nil, &feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: reason}, nil
	}
	if r.Key == rejectKey {
		if s.fault == "rejectionAsError" {
			return "", nil, nil, errDown
		}
		return reject("refused")
	}
	if len(r.Doc) > maxDocument || s.fault == "rejectsAtLimit" && len(r.Doc) == maxDocument {
		if s.fault == "oversizeAsError" {
			return "", nil, nil, errors.New("document too large")
		}
		return reject("the document is larger than 4 MiB")
	}
	k, d := string(r.Key), r.Doc
	switch s.fault {
	case "truncatesLongKeys":
		k = k[:min(len(k), longKeyCutsOff)]
	case "unescapesKeys":
		if u, err := url.PathUnescape(k); err == nil {
			k = u
		}
	case "foldsCase":
		k = strings.ToLower(k)
	case "trimsSpace":
		k = strings.TrimRight(k, " ")
	case "asciiOnly":
		if d != nil {
			d = json.RawMessage(strings.Map(func(c rune) rune { return min(c, utf8.RuneSelf-1) }, string(d)))
		}
	case "truncatesLargeDocs":
		if len(d) > 64<<10 {
			d = json.RawMessage(`{"truncated":true}`)
		}
	case "decodesFloat64":
		if d != nil {
			var v any
			if err := json.Unmarshal(d, &v); err != nil {
				return "", nil, nil, err
			}
			d, _ = json.Marshal(v)
		}
	}
	return feed.Key(k), d, nil, nil
}

// guardPasses says whether the seq guard lets r replace what m holds.
func (s *faultySink) guardPasses(m map[feed.Key]entry, k feed.Key, seq feed.Seq) bool {
	old, ok := m[k]
	return !ok || old.seq <= seq || s.fault == "unconditional"
}

func (s *faultySink) store(m map[feed.Key]entry, k feed.Key, seq feed.Seq, d json.RawMessage) {
	switch {
	case d == nil && s.fault == "deleteIgnored":
	case d == nil && s.fault == "forgetsTombstoneSeq":
		delete(m, k)
	default:
		m[k] = entry{seq, d}
	}
}

// apply applies records to m, ignoring those below floor; s.t.mu is held.
func (s *faultySink) apply(m map[feed.Key]entry, floor feed.Seq, records []feed.Record) ([]feed.Rejection, error) {
	if s.t.down {
		if s.fault != "faultAsRejection" {
			return nil, errDown
		}
		var rej []feed.Rejection
		for _, r := range records {
			rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: errDown.Error()})
		}
		return rej, nil
	}
	var rej []feed.Rejection
	for _, r := range records {
		k, d, bad, err := s.prepare(r)
		if err != nil {
			return nil, err
		}
		if bad != nil {
			rej = append(rej, *bad)
			continue
		}
		if (r.Seq >= floor || s.fault == "noFloor") && s.guardPasses(m, k, r.Seq) {
			s.store(m, k, r.Seq, d)
		}
	}
	return rej, nil
}

func (s *faultySink) Apply(_ context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if s.fault == "checkThenWrite" {
		return s.checkThenWrite(records)
	}
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	if s.fault == "dedupeBeforeSend" { // skips what it sent before, landed or not
		var fresh []feed.Record
		for _, r := range records {
			if s.t.sent[r.Key] != r.Seq {
				fresh = append(fresh, r)
			}
			s.t.sent[r.Key] = r.Seq
		}
		records = fresh
	}
	return s.apply(s.t.live, s.t.floor, records)
}

// checkThenWrite reads the stored seqs, then writes in a second step: the
// guard holds for one caller at a time, but of two racing callers the one
// that writes last wins, older or not.
func (s *faultySink) checkThenWrite(records []feed.Record) ([]feed.Rejection, error) {
	s.t.mu.Lock()
	if s.t.down {
		s.t.mu.Unlock()
		return nil, errDown
	}
	var pass []feed.Record
	var rej []feed.Rejection
	for _, r := range records {
		if r.Key == rejectKey || len(r.Doc) > maxDocument {
			rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "refused"})
		} else if r.Seq >= s.t.floor && s.guardPasses(s.t.live, r.Key, r.Seq) {
			pass = append(pass, r)
		}
	}
	s.t.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // long enough for the rival to check too
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	for _, r := range pass {
		s.store(s.t.live, r.Key, r.Seq, r.Doc)
	}
	return rej, nil
}

func (s *faultySink) OpenResync(_ context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	if g < 1 && s.fault != "acceptsGeneration0" {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", g)
	}
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	if s.t.down {
		return nil, errDown
	}
	sh := s.t.shadows[g]
	reuse := sh != nil && (sh.aborted && s.fault == "abortLeaks" || !sh.aborted && s.fault == "crashLeaks")
	if !reuse {
		sh = &shadow{m: map[feed.Key]entry{}}
		s.t.shadows[g] = sh
	}
	sh.aborted = false
	if s.fault == "noFloorSetter" { // hides SetFloor: a copy sent no record has no floor
		return struct{ feed.ResyncTarget }{&faultyResync{s: s, g: g, sh: sh}}, nil
	}
	return &faultyResync{s: s, g: g, sh: sh}, nil
}

func (s *faultySink) contents(context.Context) (map[feed.Key]json.RawMessage, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, e := range s.t.live {
		if e.doc != nil {
			out[k] = e.doc
		}
	}
	return out, nil
}

type faultyResync struct {
	s  *faultySink
	g  feed.Generation
	sh *shadow
}

func (r *faultyResync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if r.s.fault == "resyncInPlace" {
		return r.s.Apply(ctx, records)
	}
	r.s.t.mu.Lock()
	defer r.s.t.mu.Unlock()
	if r.sh.floor == 0 && len(records) > 0 && !r.s.t.down {
		r.sh.floor = records[0].Seq
		for _, rec := range records {
			r.sh.floor = min(r.sh.floor, rec.Seq)
		}
	}
	return r.s.apply(r.sh.m, r.sh.floor, records)
}

func (r *faultyResync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.s.t.mu.Lock()
	defer r.s.t.mu.Unlock()
	if r.s.t.down {
		return errDown
	}
	if r.s.fault != "ignoresSetFloor" {
		r.sh.floor = floor
	}
	return nil
}

func (r *faultyResync) Publish(context.Context) error {
	t := r.s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return errDown
	}
	if t.shadows[r.g] == r.sh {
		delete(t.shadows, r.g)
	}
	switch r.s.fault {
	case "resyncInPlace":
	case "publishMerges":
		maps.Copy(t.live, r.sh.m)
		t.floor = r.sh.floor
	case "publishKeyByKey": // empties the live copy, then fills it key by key
		t.live = map[feed.Key]entry{}
		for k, e := range r.sh.m {
			t.mu.Unlock()
			time.Sleep(20 * time.Microsecond)
			t.mu.Lock()
			t.live[k] = e
		}
		t.floor = r.sh.floor
	default:
		t.live, t.floor = r.sh.m, r.sh.floor
	}
	return nil
}

func (r *faultyResync) Abort(ctx context.Context) error {
	if r.s.fault == "abortPublishes" {
		return r.Publish(ctx)
	}
	t := r.s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.s.fault == "abortLeaks" {
		r.sh.aborted = true // left for the next OpenResync to pick up
	} else if t.shadows[r.g] == r.sh {
		delete(t.shadows, r.g)
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
		s := newFaultySink(fault)
		return feedtest.SinkHarness{
			Sink:             s,
			Contents:         s.contents,
			ConditionalOnSeq: true,
			RejectKey:        rejectKey,
			AtomicPublish:    true,
			MaxDocumentBytes: maxDocument,
			Fault: func(*testing.T) func() {
				s.t.mu.Lock()
				s.t.down = true
				s.t.mu.Unlock()
				return func() {
					s.t.mu.Lock()
					s.t.down = false
					s.t.mu.Unlock()
				}
			},
			Reopen: func(*testing.T) feed.Sink { return &faultySink{fault: fault, t: s.t} },
		}
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
