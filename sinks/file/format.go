package file

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kairos-es/kairos/feed"
)

// FormatVersion is the kairos_file value of the header line this package
// writes and reads.
const FormatVersion = 1

type header struct {
	KairosFile int             `json:"kairos_file"`
	Generation feed.Generation `json:"generation"`
	// Floor is the lowest seq a resync's copy was first sent: a record
	// below it is of an older generation (seqs are never reset), and Apply
	// writes none, so the file never holds one.
	Floor feed.Seq `json:"floor,omitempty"`
}

type line struct {
	Key     feed.Key        `json:"key"`
	Seq     feed.Seq        `json:"seq"`
	Doc     json.RawMessage `json:"doc,omitempty"`
	Deleted bool            `json:"deleted,omitempty"`
}

func headerLine(g feed.Generation, floor feed.Seq) []byte {
	b, _ := json.Marshal(header{KairosFile: FormatVersion, Generation: g, Floor: floor})
	return append(b, '\n')
}

// appendRecord appends r's line to buf. The document is compacted onto one
// line; a document that is not JSON is an error (the feed hands out none).
func appendRecord(buf []byte, r feed.Record) ([]byte, error) {
	var doc bytes.Buffer
	if !r.Deleted() {
		if err := json.Compact(&doc, r.Doc); err != nil {
			return buf, fmt.Errorf("key %q: the document is not JSON: %w", r.Key, err)
		}
	}
	b, err := json.Marshal(line{Key: r.Key, Seq: r.Seq, Doc: doc.Bytes(), Deleted: r.Deleted()})
	if err != nil {
		return buf, err
	}
	return append(append(buf, b...), '\n'), nil
}

// ErrNotAKairosFile: the file's first line is not this package's header.
var ErrNotAKairosFile = errors.New("not a kairos file (its first line is not a kairos_file header)")

// fold reads r from byte offset at (0: from the start, header included) and
// calls each for every complete record line, with its bytes. It returns the
// header (when it read it), and the offset just past the last
// complete line: a last line without its newline is left for later.
func fold(r io.Reader, at int64, each func(l line, raw []byte)) (h header, end int64, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	end = at
	first := at == 0
	for {
		raw, err := br.ReadBytes('\n')
		if err == io.EOF {
			return h, end, nil // an unfinished last line is not folded
		}
		if err != nil {
			return h, end, err
		}
		if first {
			first = false
			if json.Unmarshal(raw, &h) != nil || h.KairosFile != FormatVersion {
				return h, end, ErrNotAKairosFile
			}
			end += int64(len(raw))
			continue
		}
		var l line
		if err := json.Unmarshal(raw, &l); err != nil || l.Key == "" || l.Seq < 1 || (l.Doc == nil) != l.Deleted {
			return h, end, fmt.Errorf("line at byte %d is not a record line", end)
		}
		each(l, raw)
		end += int64(len(raw))
	}
}

// Snapshot is a file's live documents, as Load folded them.
type Snapshot struct {
	// Generation is the header's: the resync that wrote this copy, 0 for
	// one no resync made.
	Generation feed.Generation
	// Docs are the live documents by key.
	Docs map[feed.Key]json.RawMessage
	// Seqs are the seqs of the documents and of the deleted keys whose
	// tombstones the file still holds.
	Seqs map[feed.Key]feed.Seq
}

// Load folds the file at path into its live documents: per key the line
// with the highest seq, a deleted line removing the key.
func Load(path string) (Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return Snapshot{}, err
	}
	defer f.Close()
	s := Snapshot{Docs: map[feed.Key]json.RawMessage{}, Seqs: map[feed.Key]feed.Seq{}}
	var h header
	h, _, err = fold(f, 0, func(l line, _ []byte) {
		if l.Seq <= s.Seqs[l.Key] {
			return
		}
		s.Seqs[l.Key] = l.Seq
		if l.Deleted {
			delete(s.Docs, l.Key)
		} else {
			s.Docs[l.Key] = l.Doc
		}
	})
	if err != nil {
		return Snapshot{}, fmt.Errorf("reading %s: %w", path, err)
	}
	s.Generation = h.Generation
	return s, nil
}

// Read is Load's live documents alone.
func Read(path string) (map[feed.Key]json.RawMessage, error) {
	s, err := Load(path)
	return s.Docs, err
}
