package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The walkthrough is a README command: it must keep running, and keep showing
// what it claims to show.
func TestWalkthrough(t *testing.T) {
	var buf bytes.Buffer
	out = &buf
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"a rival worker is refused",
		"the sink refused p-2: parked",
		"p-3@4 deleted",
		"retried p-2: true",
		"p-2@6",
		"p-3 is absent",
		"describe: head 6, cursor g1@6, pending 0, parked 0",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, buf.String())
		}
	}
}
