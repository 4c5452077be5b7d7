//go:build unix

package bleve

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockDir takes the directory's lock file exclusively, waiting up to
// timeout for another process to let go. flock locks belong to an open file,
// so a second open in this process conflicts too, which the process's shared
// root (see roots) never does.
func lockDir(path string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, ErrLocked
		}
		time.Sleep(20 * time.Millisecond)
	}
}
