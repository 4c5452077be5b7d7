package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/feed"
)

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Brokers are the seed brokers, host:port each. Required.
	Brokers []string
	// Topic is the sink's Options.Topic. Defaults to DefaultTopic.
	Topic string
	// ClientOptions are more franz-go client options (TLS, SASL, a
	// dialer). Defaults to none.
	ClientOptions []kgo.Opt
}

// Reader builds a sink's live documents from its topics, the way every
// consumer must (see the package doc, # Consumers): it follows the pointer
// to the live copy, reads that copy from the start, leaves out the records
// below the copy's floor, and keeps for each key the record with the
// highest kairos-seq header, a tombstone deleting it.
// It is safe for concurrent use.
type Reader struct {
	names      names
	clientOpts []kgo.Opt
	cl         *kgo.Client
}

// NewReader returns a reader once the brokers answered and the pointer
// topic exists.
func NewReader(ctx context.Context, opts ReaderOptions) (*Reader, error) {
	if len(opts.Brokers) == 0 {
		return nil, feed.Invalid("kafka.brokers", "must name at least one seed broker (host:port)")
	}
	if opts.Topic == "" {
		opts.Topic = DefaultTopic
	}
	if err := validTopic("kafka.topic", opts.Topic, MaxTopicLen); err != nil {
		return nil, err
	}
	r := &Reader{names: newNames(opts.Topic)}
	r.clientOpts = clientOptions(opts.ClientOptions, opts.Brokers)
	cl, err := kgo.NewClient(r.clientOpts...)
	if err != nil {
		return nil, feed.Invalid("kafka.client_options", "are refused by the client: %v", err)
	}
	if _, err := endOffset(ctx, kadm.NewClient(cl), r.names.pointer); err != nil {
		cl.Close()
		return nil, err
	}
	r.cl = cl
	return r, nil
}

// Close closes the reader's client.
func (r *Reader) Close() { r.cl.Close() }

// Snapshot is a sink's live copy as a Reader read it.
type Snapshot struct {
	// Topic is the live copy the pointer named.
	Topic string
	// Generation is the copy's generation; 0 for the first copy, which no
	// resync made.
	Generation feed.Generation
	// Floor is the copy's floor, as the pointer names it: records below it
	// were left out (0: none).
	Floor feed.Seq
	// Docs are the live documents by key.
	Docs map[feed.Key]json.RawMessage
	// Seqs are the seqs the documents and the deleted keys still in the
	// topic were read at.
	Seqs map[feed.Key]feed.Seq
}

// maxRestarts bounds how often Read starts again because the copy it read
// was retired under it: each restart follows a publish that happened
// meanwhile.
const maxRestarts = 8

// Read reads the live copy whole: every record of each partition up to (at
// least) its end offset when the read began. A copy retired by a publish
// while it was read is read again from the new pointer, so a read returns
// one copy, the old or the new, never a mix of the two.
func (r *Reader) Read(ctx context.Context) (Snapshot, error) {
	adm := kadm.NewClient(r.cl)
	for range maxRestarts {
		p, err := readPointer(ctx, r.clientOpts, adm, r.names)
		if err != nil {
			return Snapshot{}, err
		}
		snap, err := r.readCopy(ctx, adm, p)
		if errors.Is(err, errTopicGone) {
			continue
		}
		return snap, err
	}
	return Snapshot{}, fmt.Errorf("kafka: the live copy of %s was retired %d times while it was read", r.names.base, maxRestarts)
}

func (r *Reader) readCopy(ctx context.Context, adm *kadm.Client, p pointer) (Snapshot, error) {
	snap := Snapshot{Topic: p.Topic, Generation: p.Generation, Floor: p.Floor, Docs: map[feed.Key]json.RawMessage{}, Seqs: map[feed.Key]feed.Seq{}}
	starts, err := adm.ListStartOffsets(ctx, p.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return snap, r.gone(ctx, adm, p, fmt.Errorf("kafka: reading the start of %s: %w", p.Topic, err))
	}
	ends, err := adm.ListEndOffsets(ctx, p.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return snap, r.gone(ctx, adm, p, fmt.Errorf("kafka: reading the end of %s: %w", p.Topic, err))
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Offset > s.Offset {
			want[o.Partition] = o.Offset
		}
	})
	err = consume(ctx, r.clientOpts, p.Topic, want, kgo.NewOffset().AtStart(), func(rec *kgo.Record) error {
		seq, err := recordSeq(rec)
		if err != nil {
			return err
		}
		if seq < p.Floor {
			return nil // of an older generation: a stale call's
		}
		k := feed.Key(rec.Key)
		if old, ok := snap.Seqs[k]; ok && old >= seq {
			return nil
		}
		snap.Seqs[k] = seq
		if rec.Value == nil {
			delete(snap.Docs, k)
		} else {
			snap.Docs[k] = rec.Value
		}
		return nil
	}, func(ctx context.Context) error { return r.gone(ctx, adm, p, nil) })
	return snap, err
}

// gone returns errTopicGone when the pointer moved on from p (its copy is
// retired, and may be deleted), else err.
func (r *Reader) gone(ctx context.Context, adm *kadm.Client, p pointer, err error) error {
	end, endErr := endOffset(ctx, adm, r.names.pointer)
	if endErr == nil && end != p.end {
		return errTopicGone
	}
	return err
}

// recordSeq reads a record's kairos-seq header.
func recordSeq(rec *kgo.Record) (feed.Seq, error) {
	for _, h := range rec.Headers {
		if h.Key == HeaderSeq {
			n, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("kafka: %s partition %d offset %d: the %s header %q is not a seq", rec.Topic, rec.Partition, rec.Offset, HeaderSeq, h.Value)
			}
			return feed.Seq(n), nil
		}
	}
	return 0, fmt.Errorf("kafka: %s partition %d offset %d has no %s header; only the sink may write to its topics", rec.Topic, rec.Partition, rec.Offset, HeaderSeq)
}
