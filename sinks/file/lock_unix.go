//go:build unix

package file

import (
	"os"
	"syscall"
)

// flock takes (or, with unlock, releases) the exclusive lock on f that
// makes one Apply's read and append one step across processes.
func flock(f *os.File, unlock bool) error {
	how := syscall.LOCK_EX
	if unlock {
		how = syscall.LOCK_UN
	}
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
