package bleve

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/mapping"
	bolt "go.etcd.io/bbolt"

	"github.com/kairos-es/kairos/feed"
)

// The directory's layout (see "Layout" in the package doc).
const (
	pointerFile = "CURRENT"
	lockFile    = "LOCK"
	indexSub    = "index"     // the bleve index inside an index directory
	seqsFile    = "seqs.bolt" // the seq of every key the index has seen
)

// ErrLocked is returned by New and NewSearcher when another process has the
// directory open: bleve's index is a single-process store.
var ErrLocked = errors.New("bleve: the directory is in use by another process")

// ErrClosed is returned by a closed Sink's or Searcher's calls, and by a
// resync target's once a newer OpenResync or Abort threw it away.
var ErrClosed = errors.New("bleve: closed")

var (
	seqsBucket = []byte("seqs")
	metaBucket = []byte("meta")
	floorKey   = []byte("floor")
)

// roots holds the directories this process has open, so that every Sink and
// Searcher of one directory share one open index: bleve lets one opener in,
// and sharing also makes the seq guard one step for all of them (root.wmu).
var roots = struct {
	sync.Mutex
	m map[string]*root
}{m: map[string]*root{}}

// root is one open directory, shared by the process's sinks and searchers.
type root struct {
	dir  string
	lock *os.File
	refs int // sinks and searchers open on it, under roots

	// wmu serialises every change to the directory and its indexes: an
	// Apply (seq lookup, seq write and batch), OpenResync, Publish, Abort.
	wmu      sync.Mutex
	building map[*indexDir]bool

	// hmu guards live, retired and each index's refs: searches take it only
	// for as long as it takes to count a reference, never across a batch.
	hmu     sync.Mutex
	live    *indexDir
	retired map[string]*indexDir // published-over indexes a search still holds
	closed  bool
}

// indexDir is one index directory: the bleve index and its seq store.
type indexDir struct {
	name string
	path string
	// mu guards idx, which a failed batch replaces (see reopen) while
	// searches may be reading through it: every use of the index holds mu
	// for reading (use), the replacement for writing.
	mu   sync.RWMutex
	idx  bleve.Index // nil once closed, or after a reopen that failed
	shut bool        // closed for good: idx is never opened again
	seqs *bolt.DB
	// floor is the lowest seq a resync copy was sent: every record the
	// worker sends it afterwards is at or above it (see "The seq guard" in
	// the package doc). 0 for the first, empty index, which has none.
	floor  feed.Seq
	resync bool // created by OpenResync: its first Apply sets floor
	refs   int  // under root.hmu: 1 while live, and 1 per call in flight
	gone   bool // retired by a publish: removed once the last reference goes
	dead   bool // a resync target thrown away (under root.wmu)
	once   sync.Once
}

// openRoot returns the process's root for c.dir, opening it (and creating an
// empty index when the directory has none) on first use.
func openRoot(c *config) (*root, error) {
	roots.Lock()
	defer roots.Unlock()
	if r := roots.m[c.dir]; r != nil {
		r.refs++
		return r, nil
	}
	r, err := loadRoot(c.dir, c.Mapping, c.LockTimeout, true)
	if err != nil {
		return nil, err
	}
	r.refs = 1
	roots.m[c.dir] = r
	return r, nil
}

// loadRoot locks dir and opens its live index; create says an empty or
// missing directory gets a first, empty index (a Searcher does not create).
func loadRoot(dir string, m mapping.IndexMapping, timeout time.Duration, create bool) (*root, error) {
	switch fi, err := os.Stat(dir); {
	case err == nil && !fi.IsDir():
		return nil, feed.Invalid("bleve.dir", "%s is not a directory", dir)
	case errors.Is(err, os.ErrNotExist) && create:
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("bleve: creating %s: %w", dir, err)
		}
	case err != nil:
		return nil, fmt.Errorf("bleve: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockFile), timeout)
	if err != nil {
		if errors.Is(err, ErrLocked) {
			return nil, fmt.Errorf("%w (%s, waited %v)", ErrLocked, dir, timeout)
		}
		return nil, fmt.Errorf("bleve: locking %s: %w", dir, err)
	}
	r := &root{dir: dir, lock: lock, building: map[*indexDir]bool{}, retired: map[string]*indexDir{}}
	name, err := readPointer(dir)
	switch {
	case errors.Is(err, os.ErrNotExist) && create:
		if err := checkForeign(dir); err != nil {
			lock.Close()
			return nil, err
		}
		ix, err := createIndex(dir, indexName(0), m)
		if err == nil {
			var renamed bool
			if renamed, err = r.point(ix); err != nil && renamed {
				_ = os.Remove(filepath.Join(dir, pointerFile)) // it names the index removed below
			}
		}
		if err != nil {
			if ix != nil {
				ix.close(true)
			}
			lock.Close()
			return nil, err
		}
		r.live = ix
	case err != nil:
		lock.Close()
		return nil, err
	default:
		ix, err := openIndex(dir, name)
		if err != nil {
			lock.Close()
			return nil, err
		}
		r.live = ix
	}
	r.live.refs = 1
	r.sweep() // what a crash left: unpublished resyncs, old indexes not yet removed
	return r, nil
}

// release drops one sink's or searcher's hold; the last one closes the
// directory, keeping the live index on disk.
func (r *root) release() error {
	roots.Lock()
	defer roots.Unlock()
	if r.refs--; r.refs > 0 {
		return nil
	}
	delete(roots.m, r.dir)
	r.wmu.Lock()
	defer r.wmu.Unlock()
	var errs []error
	for ix := range r.building {
		ix.dead = true
		errs = append(errs, ix.close(false))
	}
	clear(r.building)
	r.hmu.Lock()
	r.closed = true
	live := r.live
	r.hmu.Unlock()
	errs = append(errs, live.close(false), r.lock.Close())
	return errors.Join(errs...)
}

// acquire counts a reference to the live index for one call.
func (r *root) acquire() (*indexDir, error) {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	r.live.refs++
	return r.live, nil
}

// put drops a reference acquire took; the last reference to an index a
// publish retired closes and removes it.
func (r *root) put(ix *indexDir) {
	r.hmu.Lock()
	ix.refs--
	last := ix.refs == 0 && ix.gone
	if last {
		delete(r.retired, ix.name)
	}
	r.hmu.Unlock()
	if last {
		_ = ix.close(true) // best effort: a leftover is swept at the next open
	}
}

// swap makes ix the live index (its directory named by the pointer already)
// and retires the old one.
func (r *root) swap(ix *indexDir) {
	r.hmu.Lock()
	old := r.live
	r.live, ix.refs = ix, 1
	old.refs--
	old.gone = true
	last := old.refs == 0
	if !last {
		r.retired[old.name] = old
	}
	r.hmu.Unlock()
	if last {
		_ = old.close(true)
	}
}

// point writes the pointer file naming ix, durably and atomically: ix's files
// are synced first, then the pointer goes to a temporary file, which is
// synced, renamed over the pointer, and the directory synced. renamed says
// the pointer names ix now (a crash from then on reopens ix), even when the
// directory's sync then failed.
func (r *root) point(ix *indexDir) (renamed bool, err error) {
	if err := syncTree(ix.path); err != nil {
		return false, fmt.Errorf("bleve: syncing the index %s: %w", ix.name, err)
	}
	tmp := filepath.Join(r.dir, pointerFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, fmt.Errorf("bleve: writing the pointer: %w", err)
	}
	_, err = f.WriteString(ix.name + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(r.dir, pointerFile))
		renamed = err == nil
	}
	if err == nil {
		err = syncDir(r.dir)
	}
	if err != nil {
		return renamed, fmt.Errorf("bleve: writing the pointer: %w", err)
	}
	return true, nil
}

// sweep removes every index directory that is neither live, nor being
// built, nor held by a search, and a pointer's temporary file. Called under
// wmu (or before the root is shared).
func (r *root) sweep() {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	r.hmu.Lock()
	keep := map[string]bool{r.live.name: true}
	for n := range r.retired {
		keep[n] = true
	}
	r.hmu.Unlock()
	for ix := range r.building {
		keep[ix.name] = true
	}
	for _, e := range entries {
		if n := e.Name(); n == pointerFile+".tmp" || validName(n) && !keep[n] {
			_ = os.RemoveAll(filepath.Join(r.dir, n))
		}
	}
}

// indexName is a fresh index directory's name: the generation it was built
// for (0: the first, empty index) and a random suffix, so a resync never
// reuses a directory a crashed one left.
func indexName(g feed.Generation) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("g%08d-%s", g, hex.EncodeToString(b[:]))
}

func validName(n string) bool {
	if len(n) != 18 || n[0] != 'g' || n[9] != '-' {
		return false
	}
	for i, c := range n[1:] {
		if i == 8 {
			continue
		}
		if !(c >= '0' && c <= '9' || i > 8 && c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func readPointer(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, pointerFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("bleve: reading the pointer: %w", err)
	}
	name := strings.TrimSuffix(string(b), "\n")
	if !validName(name) {
		return "", fmt.Errorf("bleve: the pointer %s names no index directory (%.40q); the directory is damaged", filepath.Join(dir, pointerFile), name)
	}
	return name, nil
}

// checkForeign refuses a directory without a pointer that holds anything but
// what the sink itself writes there, so the sink never sweeps away files of
// someone else's.
func checkForeign(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("bleve: %w", err)
	}
	for _, e := range entries {
		if n := e.Name(); n != lockFile && n != pointerFile+".tmp" && !validName(n) {
			return feed.Invalid("bleve.dir", "%s holds %q and no index; give the sink a directory of its own", dir, n)
		}
	}
	return nil
}

func createIndex(dir, name string, m mapping.IndexMapping) (*indexDir, error) {
	ix := &indexDir{name: name, path: filepath.Join(dir, name)}
	if err := os.Mkdir(ix.path, 0o700); err != nil {
		return nil, fmt.Errorf("bleve: creating the index directory: %w", err)
	}
	idx, err := bleve.New(filepath.Join(ix.path, indexSub), m)
	if err != nil {
		_ = os.RemoveAll(ix.path)
		return nil, fmt.Errorf("bleve: creating the index %s: %w", name, err)
	}
	ix.idx = idx
	if err := ix.openSeqs(); err != nil {
		ix.close(true)
		return nil, err
	}
	return ix, nil
}

func openIndex(dir, name string) (*indexDir, error) {
	ix := &indexDir{name: name, path: filepath.Join(dir, name)}
	idx, err := ix.openBleve()
	if err != nil {
		return nil, fmt.Errorf("bleve: opening the live index %s: %w", name, err)
	}
	ix.idx = idx
	if err := ix.openSeqs(); err != nil {
		ix.close(false)
		return nil, err
	}
	return ix, nil
}

func (ix *indexDir) openBleve() (bleve.Index, error) {
	return bleve.OpenUsing(filepath.Join(ix.path, indexSub), map[string]any{"bolt_timeout": "1s"})
}

// use runs f on the open index, holding it open until f returns. An index
// whose reopen after a failed batch failed too is opened again first, so a
// disk that has room again serves searches without waiting for a write.
func (ix *indexDir) use(f func(bleve.Index) error) error {
	for {
		ix.mu.RLock()
		if idx := ix.idx; idx != nil {
			defer ix.mu.RUnlock()
			return f(idx)
		}
		ix.mu.RUnlock()
		if err := ix.reopen(nil); err != nil {
			return err
		}
	}
}

// reopen closes the index and opens it again from its files, when it is
// still failed (the index a batch failed on, or nil for none open).
//
// A batch bleve fails (a full disk, say) cannot be left in memory: bleve
// makes its new segment live before persisting it, and on a failed persist
// closes that segment while its live snapshot still holds it, so that every
// later read of the field panics and the next persist would write from a
// closed segment. Opening the index again drops what never reached the disk
// and serves what did; the seqs of the failed batch stay written, which the
// guard allows (see "Writes and the seq guard" in the package doc), and
// the worker sends the batch again.
func (ix *indexDir) reopen(failed bleve.Index) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.shut {
		return fmt.Errorf("bleve: the index %s: %w", ix.name, ErrClosed)
	}
	if ix.idx != failed {
		return nil // opened again already, by a search or an earlier call
	}
	if ix.idx != nil {
		_ = ix.idx.Close() // what it did not persist is dropped either way
		ix.idx = nil
	}
	idx, err := ix.openBleve()
	if err != nil {
		return fmt.Errorf("bleve: opening the index %s again after a failed write: %w", ix.name, err)
	}
	ix.idx = idx
	return nil
}

func (ix *indexDir) openSeqs() error {
	db, err := bolt.Open(filepath.Join(ix.path, seqsFile), 0o600, &bolt.Options{Timeout: time.Second})
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error {
			if _, err := tx.CreateBucketIfNotExists(seqsBucket); err != nil {
				return err
			}
			meta, err := tx.CreateBucketIfNotExists(metaBucket)
			if err != nil {
				return err
			}
			if v := meta.Get(floorKey); len(v) == 8 {
				ix.floor = feed.Seq(binary.BigEndian.Uint64(v))
			}
			return nil
		})
		if err != nil {
			db.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("bleve: opening the seqs of %s: %w", ix.name, err)
	}
	ix.seqs = db
	return nil
}

// close closes the index once, and removes its directory when remove says.
func (ix *indexDir) close(remove bool) error {
	var err error
	ix.once.Do(func() {
		ix.mu.Lock()
		idx := ix.idx
		ix.idx, ix.shut = nil, true
		ix.mu.Unlock()
		var errs []error
		if idx != nil {
			errs = append(errs, idx.Close())
		}
		if ix.seqs != nil {
			errs = append(errs, ix.seqs.Close())
		}
		err = errors.Join(errs...)
	})
	if remove {
		if rerr := os.RemoveAll(ix.path); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// syncTree fsyncs every file and directory under path, so that an index is
// whole on disk before the pointer names it.
func syncTree(path string) error {
	return filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return syncDir(p)
		}
		f, err := os.Open(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // a segment a merge just removed
			}
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
