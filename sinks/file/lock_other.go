//go:build !unix

package file

import "os"

// flock is a no-op where the system has no flock: the Sink's own mutex
// still serializes the calls of one process (see the package doc).
func flock(*os.File, bool) error { return nil }
