package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// P5's peak memory must be the worker's own, not the harness's (which holds
// latency samples and a Watermill client), so the resync runs in a child: the
// same binary re-executed with childEnv set, which reports its time and its
// peak resident set (VmHWM) as one JSON line.

const childEnv = "KAIROS_BENCH_CHILD"

type childJob struct {
	URL    string `json:"url"`
	Schema string `json:"schema"`
	Feed   string `json:"feed"`
	Sink   string `json:"sink"`
	Rows   int    `json:"rows"`
}

type childResult struct {
	Seconds    float64 `json:"seconds"`
	PeakRSSKiB int64   `json:"peak_rss_kib"`
	Error      string  `json:"error,omitempty"`
}

// childResync runs a resync of feed f into a no-op sink in a child process.
// Each call uses a sink name of its own, so every resync starts from an absent
// cursor.
func (e *env) childResync(ctx context.Context, schemaName string, f feed.FeedName, sinkPrefix string, rows int) (childResult, error) {
	job := childJob{URL: e.url, Schema: schemaName, Feed: string(f), Sink: fmt.Sprintf("%s_%s_%d", sinkPrefix, f, time.Now().UnixNano()), Rows: rows}
	spec, _ := json.Marshal(job)
	self, err := os.Executable()
	if err != nil {
		return childResult{}, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res childResult
	if jerr := json.Unmarshal(lastLine(out), &res); jerr != nil {
		return childResult{}, fmt.Errorf("resync child: %v (output %q, stderr %q)", err, out, stderr.String())
	}
	if res.Error != "" {
		return childResult{}, fmt.Errorf("resync child: %s", res.Error)
	}
	if err != nil {
		return childResult{}, fmt.Errorf("resync child: %w", err)
	}
	return res, nil
}

func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

// runChild runs the job in childEnv, if set, prints its result and reports
// true; the caller then exits.
func runChild() bool {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return false
	}
	res := childResult{}
	if err := childRun(spec, &res); err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return true
}

func childRun(spec string, res *childResult) error {
	var job childJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := &env{url: job.URL}
	p, err := e.pool(ctx, 4, nil)
	if err != nil {
		return err
	}
	defer p.Close()
	st, err := pgfeed.New(ctx, p, pgfeed.Options{Schema: job.Schema, Logger: quiet})
	if err != nil {
		return err
	}
	defer st.Close()
	rate, err := catchUp(ctx, st, feed.SinkID{Feed: feed.FeedName(job.Feed), Sink: feed.SinkName(job.Sink)}, job.Rows, true)
	if err != nil {
		return err
	}
	res.Seconds = float64(job.Rows) / rate
	res.PeakRSSKiB, err = peakRSS()
	return err
}

// peakRSS reads this process's peak resident set size, in KiB.
func peakRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}
