package bleve

import (
	"path/filepath"
	"time"

	"github.com/blevesearch/bleve/v2/mapping"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of Options. Each is what a zero field means.
const (
	// DefaultMaxDocumentBytes bounds one document's JSON. An embedded index
	// analyses a document in memory, several times its size, inside the
	// worker's own process; a larger one is rejected rather than risked.
	DefaultMaxDocumentBytes = 8 << 20
	// MinMaxDocumentBytes is the smallest limit accepted: a document of a
	// few KiB must always fit.
	MinMaxDocumentBytes = 16 << 10
	// DefaultLockTimeout is how long New waits for another process to let
	// go of the directory before it gives up with ErrLocked.
	DefaultLockTimeout = 2 * time.Second
)

// Options configure a Sink. Dir is required; the other fields' zero values
// mean their defaults.
type Options struct {
	// Dir is the sink's directory on local disk: it holds the pointer file,
	// the live index and, during a resync, the index being built (see
	// "Layout" in the package doc). New creates it when it does not exist,
	// and refuses a directory that holds anything else. Required.
	Dir string
	// Mapping is the index mapping of every index the sink creates: the
	// first one and each resync's. An index that exists already keeps the
	// mapping it was built with until the next resync, so a changed mapping
	// takes effect when the feed is next rebuilt (or the sink re-registered).
	// Defaults to DefaultMapping(): every field mapped dynamically.
	Mapping mapping.IndexMapping
	// MaxDocumentBytes bounds a document's JSON; a larger one is rejected.
	// At least MinMaxDocumentBytes. Defaults to DefaultMaxDocumentBytes.
	MaxDocumentBytes int
	// LockTimeout bounds how long New waits for the directory's lock, which
	// another process holds while it has a sink or a Searcher open on the
	// same directory. Defaults to DefaultLockTimeout.
	LockTimeout time.Duration
}

// config is Options resolved: validated and defaulted.
type config struct {
	Options
	dir string // absolute and clean: the key of the process's shared root
}

// resolve validates o and fills the defaults, naming the field of anything
// wrong, before anything is written.
func (o Options) resolve() (*config, error) {
	const p = "bleve."
	c := &config{Options: o}
	if o.Dir == "" {
		return nil, feed.Invalid(p+"dir", "must be set")
	}
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, feed.Invalid(p+"dir", "%q cannot be made absolute: %v", o.Dir, err)
	}
	c.dir = filepath.Clean(abs)
	if o.Mapping == nil {
		c.Mapping = DefaultMapping()
	} else if err := o.Mapping.Validate(); err != nil {
		return nil, feed.Invalid(p+"mapping", "%v", err)
	}
	switch {
	case o.MaxDocumentBytes == 0:
		c.MaxDocumentBytes = DefaultMaxDocumentBytes
	case o.MaxDocumentBytes < MinMaxDocumentBytes:
		return nil, feed.Invalid(p+"max_document_bytes", "is %d; it must be at least %d (0 for the default %d)", o.MaxDocumentBytes, MinMaxDocumentBytes, DefaultMaxDocumentBytes)
	}
	switch {
	case o.LockTimeout < 0:
		return nil, feed.Invalid(p+"lock_timeout", "is %v; it must be positive (0 for the default %v)", o.LockTimeout, DefaultLockTimeout)
	case o.LockTimeout == 0:
		c.LockTimeout = DefaultLockTimeout
	}
	return c, nil
}
