package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The capture example is the README's shortest way to mirror a table: it
// must keep running and keep ending with the file equal to the table.
func TestCapture(t *testing.T) {
	url := os.Getenv("KAIROS_TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	conn, err := pgx.Connect(ctx, url)
	cancel()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no PostgreSQL (CI is set, so this is a failure): %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	conn.Close(t.Context())
	// The two modes one after the other: the example's settings are
	// package variables.
	for _, c := range []bool{false, true} {
		concurrent = c
		schema = fmt.Sprintf("kairos_capture_%d", time.Now().UnixNano())
		var buf bytes.Buffer
		out = &buf
		if err := run(t.Context(), url, t.TempDir()); err != nil {
			t.Fatalf("run (concurrent %v): %v\n%s", c, err, buf.String())
		}
		mode := "(locked write mode)"
		if c {
			mode = "(concurrent write mode)"
		}
		for _, want := range []string{mode + ", keyed on [id]", "backfill in place: feed at generation 1", "rebuild: feed at generation 2", "the file holds the table's"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, buf.String())
			}
		}
		t.Log(buf.String())
	}
}
