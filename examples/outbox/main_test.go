package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/internal/pgtest"
)

// The outbox example is the README's QueueWrite use case run in earnest: 16
// handlers writing colliding orders into a concurrent-mode feed must keep
// ending with the file equal to the table.
func TestOutbox(t *testing.T) {
	url := pgtest.URL()
	// Fails in CI, skips elsewhere, when no PostgreSQL answers.
	pgtest.Pool(t, url, pgx.QueryExecModeCacheStatement)
	schema = fmt.Sprintf("kairos_outbox_%d", time.Now().UnixNano())
	var buf bytes.Buffer
	out = &buf
	if err := run(t.Context(), url, t.TempDir()); err != nil {
		t.Fatalf("run: %v\n%s", err, buf.String())
	}
	for _, want := range []string{
		"feed orders in the concurrent write mode",
		"16 handlers sent 3200 requests, each as one batch",
		"updates found their order deleted and failed",
		"commits/s",
		"of its writes back from the file: p50",
		"the file holds the table's",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, buf.String())
		}
	}
	t.Log(buf.String())
}
