// Command kairos runs and operates Kairos: it migrates the schema, checks a
// configuration file, and (as the command grows) runs the sync daemon,
// inspects feeds and repairs them.
//
// Exit codes: 0 success; 1 failure; 2 a usage or configuration mistake (a
// flag, an argument, a file that does not check); 3 refused because a lease
// is held by another process.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
)

// Exit codes, as the package doc lists them.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitLeased  = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns its exit code; tests call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ce config.Errors
	if errors.As(err, &ce) && len(ce) > 1 {
		fmt.Fprintf(stderr, "kairos: the configuration has %d mistakes:\n", len(ce))
		for _, e := range ce {
			fmt.Fprintf(stderr, "  %v\n", e)
		}
	} else {
		fmt.Fprintf(stderr, "kairos: %v\n", err)
	}
	return exitCode(err)
}

// usageError marks a mistake in how the command was called.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func exitCode(err error) int {
	var u usageError
	var ce config.Errors
	var held *feed.LeaseHeldError
	switch {
	case errors.As(err, &u), errors.As(err, &ce):
		return exitUsage
	case errors.As(err, &held), errors.Is(err, feed.ErrLeaseHeld):
		return exitLeased
	}
	return exitFailure
}
