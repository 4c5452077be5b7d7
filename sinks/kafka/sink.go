package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/feed"
)

// ErrClosed is what a closed Sink's calls return.
var ErrClosed = errors.New("kafka: the sink is closed")

// closeGrace is how long a call whose context ended waits for the client
// to fail its records before it closes the client to stop them: an
// idempotent producer keeps retrying a batch it sent without an answer, and
// a call must leave nothing of itself running once it returns.
const closeGrace = 200 * time.Millisecond

// Sink mirrors a feed into a compacted Kafka topic. The package doc says
// what it guarantees. It is safe for concurrent use.
type Sink struct {
	opts       Options
	names      names
	clientOpts []kgo.Opt // the user's options and the seed brokers: readers' and admin clients'
	prodOpts   []kgo.Opt // clientOpts and the producer's settings
	maxDoc     int
	feedHeader []byte

	mu     sync.Mutex
	cl     *kgo.Client // nil once a call closed it; made again on demand
	live   pointer
	closed bool
}

// New returns a sink once the brokers answered and its topics are in
// place: the pointer topic (Options.Topic+PointerSuffix, one partition)
// and the live copy it names (Options.Topic while nothing was ever
// published) exist and are compacted (cleanup.policy=compact), created
// when opts.Create is set. A missing topic is ErrNoTopic, one that is not
// compacted ErrNotCompacted, each naming the topic. New reads the live
// copy's max.message.bytes, which bounds the batches it sends and the
// documents it takes (MaxDocumentBytes).
func New(ctx context.Context, opts Options) (*Sink, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	s := &Sink{opts: opts, names: newNames(opts.Topic), feedHeader: []byte(opts.Feed)}
	s.clientOpts = clientOptions(opts.ClientOptions, opts.Brokers)

	cl, err := kgo.NewClient(s.clientOpts...)
	if err != nil {
		return nil, feed.Invalid("kafka.client_options", "are refused by the client: %v", err)
	}
	defer cl.Close()
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return nil, feed.Invalid("kafka.client_options", "turn idempotent writes off; the sink needs them so a retried batch is written once and in order")
	}
	if err := cl.Ping(ctx); err != nil {
		return nil, fmt.Errorf("kafka: the brokers do not answer: %w", err)
	}
	adm := kadm.NewClient(cl)
	spec := topicInfo{partitions: opts.Partitions, replication: opts.ReplicationFactor, maxMessageBytes: opts.MaxMessageBytes}
	pinfo, err := checkTopic(ctx, adm, s.names.pointer, opts.Create, topicInfo{partitions: 1, replication: opts.ReplicationFactor})
	if err != nil {
		return nil, err
	}
	if pinfo.partitions != 1 {
		return nil, fmt.Errorf("%w: the pointer topic %s has %d partitions; it must have one, so its last record is the pointer", ErrTopicShape, s.names.pointer, pinfo.partitions)
	}
	if s.live, err = readPointer(ctx, s.clientOpts, adm, s.names); err != nil {
		return nil, err
	}
	info, err := checkTopic(ctx, adm, s.live.Topic, opts.Create && s.live.Topic == s.names.base, spec)
	if err != nil {
		return nil, err
	}
	s.maxDoc = info.maxMessageBytes - recordReserve
	if s.maxDoc < 1 {
		return nil, fmt.Errorf("kafka: topic %s's max.message.bytes (%d) leaves no room for a document", s.live.Topic, info.maxMessageBytes)
	}
	s.prodOpts = append(append([]kgo.Opt(nil), s.clientOpts...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(int32(min(info.maxMessageBytes, 1<<30))),
	)
	if s.cl, err = kgo.NewClient(s.prodOpts...); err != nil {
		return nil, fmt.Errorf("kafka: the producer: %w", err)
	}
	return s, nil
}

// clientOptions are the options of every client the package makes: a
// short metadata cache first, so a topic created or deleted a moment ago
// is seen (the user may set another), then the user's, then the brokers.
func clientOptions(user []kgo.Opt, brokers []string) []kgo.Opt {
	opts := []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}
	opts = append(opts, user...)
	return append(opts, kgo.SeedBrokers(brokers...))
}

// MaxDocumentBytes is the largest document the sink produces: the live
// copy's max.message.bytes, as New read it, less room for the record's key,
// headers and batch header. A larger document is a rejection.
func (s *Sink) MaxDocumentBytes() int { return s.maxDoc }

// Topic is the live copy as this sink last read or published it.
func (s *Sink) Topic() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live.Topic
}

// Close closes the sink's client. Calls made afterwards return ErrClosed.
func (s *Sink) Close() {
	s.mu.Lock()
	cl := s.cl
	s.cl, s.closed = nil, true
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}

// client returns the sink's client, made again when a call closed it.
func (s *Sink) client() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.cl == nil {
		cl, err := kgo.NewClient(s.prodOpts...)
		if err != nil {
			return nil, fmt.Errorf("kafka: the producer: %w", err)
		}
		s.cl = cl
	}
	return s.cl, nil
}

// drop closes cl, failing whatever it still buffers or retries, and lets
// the next call make a new one.
func (s *Sink) drop(cl *kgo.Client) {
	s.mu.Lock()
	if s.cl == cl {
		s.cl = nil
	}
	s.mu.Unlock()
	cl.Close()
}

func (s *Sink) livePointer() pointer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// refresh returns the live copy, reading the pointer again when the
// pointer topic grew since it was last read (another process published).
func (s *Sink) refresh(ctx context.Context, cl *kgo.Client) (pointer, error) {
	cached := s.livePointer()
	adm := kadm.NewClient(cl)
	end, err := endOffset(ctx, adm, s.names.pointer)
	if err != nil {
		return pointer{}, err
	}
	if end == cached.end {
		return cached, nil
	}
	p, err := readPointer(ctx, s.clientOpts, adm, s.names)
	if err != nil {
		return pointer{}, err
	}
	s.mu.Lock()
	if p.end > s.live.end {
		s.live = p
	}
	s.mu.Unlock()
	return p, nil
}

// Apply produces each record to the live copy, keyed by its key, its
// document the value (nil for a tombstone), and returns once the broker
// acknowledged every one from all in-sync replicas. It checks the pointer
// beside the produce: should another process have published a copy since
// this sink read it, the batch is produced again into that copy, so it is
// never left only in a retired one.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	cl, err := s.client()
	if err != nil {
		return nil, err
	}
	live := s.livePointer()
	var (
		wg     sync.WaitGroup
		now    pointer
		chkErr error
	)
	wg.Go(func() { now, chkErr = s.refresh(ctx, cl) })
	rej, err := s.produce(ctx, cl, live, records)
	wg.Wait()
	if chkErr != nil {
		if err != nil {
			return nil, err
		}
		return nil, chkErr
	}
	if now.Topic != live.Topic {
		// The copy produced to is retired, and may be deleted already:
		// whatever became of the records there, none is read again. The
		// new copy's floor drops those of an older generation.
		return s.produce(ctx, cl, now, records)
	}
	if err != nil {
		return nil, err
	}
	return rej, nil
}

// rejectable are the produce errors that concern the records of a batch
// rather than the broker: the broker refuses what it was sent.
func rejectable(err error) bool {
	for _, e := range []*kerr.Error{kerr.MessageTooLarge, kerr.InvalidRecord, kerr.CorruptMessage, kerr.RecordListTooLarge, kerr.InvalidRecordState} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// produce writes records to the copy p names and waits for every
// acknowledgement. A record below p's floor, of an older generation, is
// dropped without being sent; one over MaxDocumentBytes is rejected. Kafka
// answers per partition's batch, not per record, so the records of a batch
// the broker refused for its contents are produced again one at a time,
// and only those it refuses alone are rejected.
func (s *Sink) produce(ctx context.Context, cl *kgo.Client, p pointer, records []feed.Record) ([]feed.Rejection, error) {
	var gen []byte
	if p.Generation > 0 {
		gen = strconv.AppendInt(nil, int64(p.Generation), 10)
	}
	var rejected []feed.Rejection
	recs := make([]*kgo.Record, 0, len(records))
	for _, r := range records {
		if r.Seq < p.Floor {
			continue // a no-op, like an older seq for readers
		}
		if len(r.Doc) > s.maxDoc {
			rejected = append(rejected, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: fmt.Sprintf(
				"the document is %d bytes, more than the %d topic %s's max.message.bytes leaves for one", len(r.Doc), s.maxDoc, p.Topic)})
			continue
		}
		headers := make([]kgo.RecordHeader, 0, 3)
		headers = append(headers, kgo.RecordHeader{Key: HeaderFeed, Value: s.feedHeader})
		if gen != nil {
			headers = append(headers, kgo.RecordHeader{Key: HeaderGeneration, Value: gen})
		}
		headers = append(headers, kgo.RecordHeader{Key: HeaderSeq, Value: strconv.AppendInt(nil, int64(r.Seq), 10)})
		recs = append(recs, &kgo.Record{Topic: p.Topic, Key: []byte(r.Key), Value: r.Doc, Headers: headers})
	}
	results := s.sync(ctx, cl, recs)
	var again []*kgo.Record
	for _, res := range results {
		switch {
		case res.Err == nil:
		case rejectable(res.Err):
			again = append(again, res.Record)
		default:
			return nil, fmt.Errorf("kafka: producing to %s: %w", p.Topic, res.Err)
		}
	}
	for _, r := range again {
		var err error
		if len(recs) > 1 {
			err = s.sync(ctx, cl, []*kgo.Record{{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}})[0].Err
		} else {
			err = results[0].Err
		}
		switch {
		case err == nil:
		case rejectable(err):
			seq, _ := strconv.ParseInt(string(r.Headers[len(r.Headers)-1].Value), 10, 64)
			rejected = append(rejected, feed.Rejection{Key: feed.Key(r.Key), Seq: feed.Seq(seq), Reason: fmt.Sprintf("topic %s refuses the record: %v", p.Topic, err)})
		default:
			return nil, fmt.Errorf("kafka: producing to %s: %w", p.Topic, err)
		}
	}
	return rejected, nil
}

// sync produces recs and waits for every one's outcome. When ctx ends
// first, the client has closeGrace to fail the records it has not sent;
// after that it is closed, which fails those it is still retrying, so
// nothing of the call goes on once it returns (a request already on the
// wire may still land, which the package doc allows for).
func (s *Sink) sync(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) kgo.ProduceResults {
	if len(recs) == 0 {
		return nil
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- cl.ProduceSync(ctx, recs...) }()
	select {
	case res := <-done:
		return res
	case <-ctx.Done():
	}
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case res := <-done:
		return res
	case <-t.C:
	}
	s.drop(cl)
	return <-done
}

// OpenResync creates a fresh copy for generation: a compacted topic of its
// own, Options.Topic-g<generation>-<random>, with the live copy's
// partition count, replication factor and max.message.bytes. It first
// deletes every copy of the sink's that the pointer does not name (those an
// earlier, crashed or aborted resync left, and retired copies a publish
// could not delete), so a resync after a crash starts empty, and a crashed
// worker's late writes to its copy fail rather than land.
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", generation)
	}
	cl, err := s.client()
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	live, err := s.refresh(ctx, cl)
	if err != nil {
		return nil, err
	}
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafka: listing topics: %w", err)
	}
	var stale []string
	for _, t := range all.Names() {
		if t != live.Topic && s.names.ours(t) {
			stale = append(stale, t)
		}
	}
	if err := deleteTopics(ctx, adm, stale...); err != nil {
		return nil, err
	}
	info, err := checkTopic(ctx, adm, live.Topic, false, topicInfo{})
	if err != nil {
		return nil, err
	}
	topic := s.names.copyName(generation)
	if _, err := checkTopic(ctx, adm, topic, true, info); err != nil {
		return nil, err
	}
	return &resync{s: s, topic: topic, generation: generation}, nil
}

// resync is one resync's copy.
type resync struct {
	s          *Sink
	topic      string
	generation feed.Generation
	mu         sync.Mutex
	published  bool
	// floor is the copy's floor, set by the first Apply that is sent
	// records, or by SetFloor; Publish writes it into the pointer. Only this value ever
	// writes to its copy before then (see # Consumers in the package doc),
	// so it is kept here until the publish.
	floor feed.Seq
}

func (r *resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	cl, err := r.s.client()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.floor == 0 && len(records) > 0 {
		r.floor = records[0].Seq
		for _, rec := range records[1:] {
			r.floor = min(r.floor, rec.Seq)
		}
	}
	p := pointer{Topic: r.topic, Generation: r.generation, Floor: r.floor}
	r.mu.Unlock()
	return r.s.produce(ctx, cl, p, records)
}

// SetFloor gives a copy that was sent no record its floor, which Publish
// then writes into the pointer, where Reader finds it; see
// feed.FloorSetter. It sends nothing to the brokers.
func (r *resync) SetFloor(_ context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	r.mu.Lock()
	r.floor = floor
	r.mu.Unlock()
	return nil
}

// Publish produces the pointer record naming this copy and waits for its
// acknowledgement: from then on a reader that reads the pointer reads this
// copy, whole. The copy it replaced is then deleted; should that fail, the
// next OpenResync deletes it.
func (r *resync) Publish(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cl, err := r.s.client()
	if err != nil {
		return err
	}
	p := pointer{Topic: r.topic, Generation: r.generation, Floor: r.floor}
	val, _ := json.Marshal(p)
	res := r.s.sync(ctx, cl, []*kgo.Record{{Topic: r.s.names.pointer, Key: []byte(r.s.names.base), Value: val}})
	if err := res[0].Err; err != nil {
		return fmt.Errorf("kafka: publishing %s through %s: %w", r.topic, r.s.names.pointer, err)
	}
	r.published = true
	s := r.s
	s.mu.Lock()
	old := s.live.Topic
	p.end = res[0].Record.Offset + 1
	s.live = p
	s.mu.Unlock()
	if old != r.topic {
		_ = deleteTopics(ctx, kadm.NewClient(cl), old) // best effort, see above
	}
	return nil
}

// Abort deletes the copy, unless the pointer names it: a Publish whose
// answer was lost may have made it live.
func (r *resync) Abort(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.published {
		return nil
	}
	cl, err := r.s.client()
	if err != nil {
		return err
	}
	live, err := r.s.refresh(ctx, cl)
	if err != nil {
		return err
	}
	if live.Topic == r.topic {
		return nil
	}
	return deleteTopics(ctx, kadm.NewClient(cl), r.topic)
}
