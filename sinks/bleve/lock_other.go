//go:build !unix

package bleve

import (
	"os"
	"time"
)

// lockDir only opens the lock file where flock is missing: bleve's own lock
// on the live index (its bolt file) still keeps a second process out of it,
// but not out of the directory's pointer and resync directories.
func lockDir(path string, _ time.Duration) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
