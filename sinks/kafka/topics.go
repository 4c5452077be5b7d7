package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/feed"
)

// Sentinels of New's and NewReader's refusals of a topic. Each error that
// matches one names the topic.
var (
	// ErrNoTopic: a topic the sink needs does not exist and Options.Create
	// is off.
	ErrNoTopic = errors.New("kafka: the topic does not exist")
	// ErrNotCompacted: a topic's cleanup.policy is not exactly compact, so
	// the broker would delete documents (retention) or never drop
	// superseded versions.
	ErrNotCompacted = errors.New("kafka: the topic is not compacted (cleanup.policy=compact)")
	// ErrTopicShape: the pointer topic has more than one partition, or the
	// pointer names a topic that is not one of the sink's copies.
	ErrTopicShape = errors.New("kafka: the topic does not have the sink's shape")
)

// errTopicGone says a copy being read was deleted under the reader (a
// publish retired it): the read starts again from the pointer.
var errTopicGone = errors.New("kafka: the topic was deleted while it was read")

// Header names every record the sink produces carries.
const (
	HeaderFeed       = "kairos-feed"
	HeaderGeneration = "kairos-generation"
	HeaderSeq        = "kairos-seq"
)

// copyRandLen is the number of hex digits that make each resync's copy a
// topic of its own.
const copyRandLen = 8

// names are the sink's topics, derived from Options.Topic.
type names struct {
	base    string
	pointer string
	copyRe  *regexp.Regexp
}

func newNames(base string) names {
	return names{
		base:    base,
		pointer: base + PointerSuffix,
		copyRe:  regexp.MustCompile(`^` + regexp.QuoteMeta(base) + `-g[0-9]+-[0-9a-f]{` + strconv.Itoa(copyRandLen) + `}$`),
	}
}

// copyName is a fresh topic name for a resync of generation g.
func (n names) copyName(g feed.Generation) string {
	var b [copyRandLen / 2]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-g%d-%s", n.base, g, hex.EncodeToString(b[:]))
}

// ours reports whether topic is one of the copies the pointer may name.
func (n names) ours(topic string) bool { return topic == n.base || n.copyRe.MatchString(topic) }

// pointer is what the pointer topic's last record says: which copy readers
// read, its generation (0 for the first copy, before any resync) and its
// floor (0: none; see # Consumers in the package doc).
type pointer struct {
	Topic      string          `json:"topic"`
	Generation feed.Generation `json:"generation"`
	Floor      feed.Seq        `json:"floor,omitempty"`
	// end is the pointer topic's end offset when this was read: a later
	// read that finds the same end offset knows nothing was published.
	end int64
}

// topicInfo is what checkTopic learnt of a topic.
type topicInfo struct {
	partitions      int32
	replication     int16
	maxMessageBytes int
}

// checkTopic checks that topic exists and is compacted, creating it with
// spec first when create is set, and reads its partition count,
// replication factor and max.message.bytes.
func checkTopic(ctx context.Context, adm *kadm.Client, topic string, create bool, spec topicInfo) (topicInfo, error) {
	for attempt := 0; ; attempt++ {
		details, err := adm.ListTopics(ctx, topic)
		if err != nil {
			return topicInfo{}, fmt.Errorf("kafka: reading topic %s: %w", topic, err)
		}
		d, ok := details[topic]
		if ok && d.Err != nil && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			return topicInfo{}, fmt.Errorf("kafka: reading topic %s: %w", topic, d.Err)
		}
		var info topicInfo
		switch {
		case ok && d.Err == nil && len(d.Partitions) > 0:
			info.partitions = int32(len(d.Partitions))
			for _, p := range d.Partitions {
				info.replication = int16(len(p.Replicas))
				break
			}
		case !create:
			return topicInfo{}, fmt.Errorf("%w: %s (set kafka.create to create it)", ErrNoTopic, topic)
		case attempt == 0:
			if err := createTopic(ctx, adm, topic, spec); err != nil {
				return topicInfo{}, err
			}
			continue
		case attempt < 100:
			// Created (by this call or a rival), but the client's
			// metadata, cached for a moment, may not show it yet.
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				return topicInfo{}, err
			}
			continue
		default:
			return topicInfo{}, fmt.Errorf("%w: %s was created, but the brokers do not show it", ErrNoTopic, topic)
		}
		cfgs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return topicInfo{}, fmt.Errorf("kafka: reading topic %s's configuration: %w", topic, err)
		}
		rc, err := cfgs.On(topic, nil)
		if err == nil {
			err = rc.Err
		}
		if err != nil {
			return topicInfo{}, fmt.Errorf("kafka: reading topic %s's configuration: %w", topic, err)
		}
		policy := ""
		for _, c := range rc.Configs {
			if c.Value == nil {
				continue
			}
			switch c.Key {
			case "cleanup.policy":
				policy = *c.Value
			case "max.message.bytes":
				if info.maxMessageBytes, err = strconv.Atoi(*c.Value); err != nil {
					return topicInfo{}, fmt.Errorf("kafka: topic %s's max.message.bytes %q is not a number", topic, *c.Value)
				}
			}
		}
		if strings.ReplaceAll(policy, " ", "") != "compact" {
			return topicInfo{}, fmt.Errorf("%w: %s has cleanup.policy=%q; with delete the broker would drop documents that did not change for retention.ms, without compact it would keep every version", ErrNotCompacted, topic, policy)
		}
		if info.maxMessageBytes == 0 {
			info.maxMessageBytes = 1048588 // Kafka's default, should a broker not say
		}
		return info, nil
	}
}

// createTopic creates a compacted topic; one that exists already (a rival
// made it first) is no error.
func createTopic(ctx context.Context, adm *kadm.Client, topic string, spec topicInfo) error {
	configs := map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}
	if spec.maxMessageBytes > 0 {
		configs["max.message.bytes"] = kadm.StringPtr(strconv.Itoa(spec.maxMessageBytes))
	}
	partitions, replication := spec.partitions, spec.replication
	if partitions == 0 {
		partitions = -1 // the broker's default
	}
	if replication == 0 {
		replication = -1
	}
	_, err := adm.CreateTopic(ctx, partitions, replication, configs, topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka: creating topic %s: %w", topic, err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// deleteTopics deletes topics; one already gone is no error.
func deleteTopics(ctx context.Context, adm *kadm.Client, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	resps, err := adm.DeleteTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("kafka: deleting topics %s: %w", strings.Join(topics, ", "), err)
	}
	for _, r := range resps {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) && !errors.Is(r.Err, kerr.UnknownTopicID) {
			return fmt.Errorf("kafka: deleting topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// endOffset is the end offset of the pointer topic's one partition.
func endOffset(ctx context.Context, adm *kadm.Client, topic string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("kafka: reading the end of topic %s: %w", topic, err)
	}
	o, ok := ends.Lookup(topic, 0)
	if !ok {
		return 0, fmt.Errorf("%w: %s has no partition 0", ErrNoTopic, topic)
	}
	if o.Err != nil {
		return 0, fmt.Errorf("kafka: reading the end of topic %s: %w", topic, o.Err)
	}
	return o.Offset, nil
}

// readPointer reads the live copy from the pointer topic's last record:
// the base topic while nothing was ever published. The last record of a
// compacted log is never compacted away, so it is always there to read.
func readPointer(ctx context.Context, clientOpts []kgo.Opt, adm *kadm.Client, n names) (pointer, error) {
	end, err := endOffset(ctx, adm, n.pointer)
	if err != nil {
		return pointer{}, err
	}
	if end == 0 {
		return pointer{Topic: n.base, end: 0}, nil
	}
	var p pointer
	err = consume(ctx, clientOpts, n.pointer, map[int32]int64{0: end}, kgo.NewOffset().At(end-1), func(r *kgo.Record) error {
		if string(r.Key) != n.base {
			return fmt.Errorf("%w: the pointer topic %s holds a record of key %q, not %q", ErrTopicShape, n.pointer, r.Key, n.base)
		}
		if err := json.Unmarshal(r.Value, &p); err != nil {
			return fmt.Errorf("%w: the pointer topic %s's record at offset %d is not a pointer: %v", ErrTopicShape, n.pointer, r.Offset, err)
		}
		return nil
	}, nil)
	if err != nil {
		return pointer{}, err
	}
	if p.Floor < 0 {
		return pointer{}, fmt.Errorf("%w: the pointer topic %s names a floor of %d, which is not a seq", ErrTopicShape, n.pointer, p.Floor)
	}
	if !n.ours(p.Topic) {
		return pointer{}, fmt.Errorf("%w: the pointer topic %s names %q, which is not one of the sink's copies of %s", ErrTopicShape, n.pointer, p.Topic, n.base)
	}
	p.end = end
	return p, nil
}

// stallCheck is how often a read that receives nothing asks whether it
// should give up (its topic deleted under it).
const stallCheck = time.Second

// consume reads topic's partitions from start until each has handed out a
// record at or past its end offset less one (want: partition → end offset,
// only partitions with records), calling each record in partition order.
// A compacted log never removes its last record, so such a record always
// comes. stalled, when not nil, is asked after each stallCheck without a
// record whether to stop; its error ends the read.
func consume(ctx context.Context, clientOpts []kgo.Opt, topic string, want map[int32]int64, start kgo.Offset, each func(*kgo.Record) error, stalled func(context.Context) error) error {
	if len(want) == 0 {
		return nil
	}
	parts := map[int32]kgo.Offset{}
	for p := range want {
		parts[p] = start
	}
	opts := append(append([]kgo.Opt(nil), clientOpts...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka: a client to read %s: %w", topic, err)
	}
	defer cl.Close()
	left := len(want)
	done := map[int32]bool{}
	for left > 0 {
		pollCtx, cancel := context.WithTimeout(ctx, stallCheck)
		fetches := cl.PollFetches(pollCtx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kafka: reading %s: %w", topic, err)
		}
		got := 0
		for _, fe := range fetches.Errors() {
			switch {
			case errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled):
			case errors.Is(fe.Err, kerr.UnknownTopicOrPartition) || errors.Is(fe.Err, kerr.UnknownTopicID):
				return errTopicGone
			default:
				return fmt.Errorf("kafka: reading %s partition %d: %w", topic, fe.Partition, fe.Err)
			}
		}
		var cbErr error
		fetches.EachRecord(func(r *kgo.Record) {
			got++
			if cbErr != nil {
				return
			}
			cbErr = each(r)
			if !done[r.Partition] && r.Offset >= want[r.Partition]-1 {
				done[r.Partition] = true
				left--
			}
		})
		if cbErr != nil {
			return cbErr
		}
		if got == 0 && stalled != nil {
			if err := stalled(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}
