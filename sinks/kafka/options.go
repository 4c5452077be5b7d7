package kafka

import (
	"fmt"
	"regexp"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/feed"
)

// Defaults and limits of Options.
const (
	// DefaultTopic is the topic a zero Options.Topic writes to.
	DefaultTopic = "kairos-docs"
	// MaxTopicLen is the longest Options.Topic: Kafka's 249-character topic
	// name limit, less the room a resync copy's suffix takes
	// ("-g<generation>-<8 hex digits>", with up to 19 digits of generation).
	MaxTopicLen = 249 - len("-g") - 19 - len("-") - copyRandLen
	// PointerSuffix is appended to Options.Topic to name the pointer topic
	// (see the package doc, # Resync).
	PointerSuffix = "-live"
	// recordReserve is what a record takes in a batch besides its
	// document, with room to spare: the batch header (61 bytes), the
	// record's varints and attributes, the longest key and the three
	// headers. Sink.MaxDocumentBytes is the topic's max.message.bytes less
	// this.
	recordReserve = 1024
)

// Options configure a Sink. Brokers and Feed are required; the other fields'
// zero values mean their defaults. Everything but ClientOptions is a plain
// value, so a config file can build a sink from `type: kafka` plus these.
type Options struct {
	// Brokers are the seed brokers, host:port each. Required.
	Brokers []string
	// Feed is the feed's name, carried in every record's kairos-feed
	// header so consumers of a topic several feeds share can tell them
	// apart. Required.
	Feed feed.FeedName
	// Topic names the sink's topics: Topic itself, the first live copy;
	// Topic+PointerSuffix, the pointer topic that says which copy is live;
	// and Topic-g<generation>-<random>, each resync's copy. 1 to
	// MaxTopicLen characters of ASCII letters, digits, '.', '_' and '-',
	// not "." nor "..". Defaults to DefaultTopic.
	Topic string
	// Create makes New create Topic and the pointer topic when they do not
	// exist, compacted, with Partitions, ReplicationFactor and
	// MaxMessageBytes. Without it a missing topic is an error, so a
	// misspelt name does not silently become a new, empty topic. A resync
	// always creates its copy, like the live one. Defaults to false.
	Create bool
	// Partitions is the partition count of a topic Create makes; 0 means
	// the broker's default (num.partitions). A resync's copy takes the
	// live copy's count. Defaults to 0.
	Partitions int32
	// ReplicationFactor is the replication factor of a topic Create makes;
	// 0 means the broker's default (default.replication.factor). A
	// resync's copy takes the live copy's. Defaults to 0.
	ReplicationFactor int16
	// MaxMessageBytes is the max.message.bytes of a topic Create makes,
	// which bounds a document (see Sink.MaxDocumentBytes); 0 leaves the
	// broker's default (message.max.bytes, about 1 MiB unless changed). A
	// resync's copy takes the live copy's. At least 2 KiB when set.
	// Defaults to 0.
	MaxMessageBytes int
	// ClientOptions are more franz-go client options, for TLS, SASL, a
	// dialer, a logger or timeouts. The sink's own come after them and
	// win: the seed brokers, acks from all in-sync replicas, the
	// key-hash partitioner and the batch size the topic allows. An option
	// that turns idempotent writes off is refused. Defaults to none.
	ClientOptions []kgo.Opt
}

var topicRe = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// validTopic checks a topic name the way Kafka does, naming field.
func validTopic(field, t string, maxLen int) error {
	switch {
	case t == "":
		return feed.Invalid(field, "must not be empty")
	case len(t) > maxLen:
		return feed.Invalid(field, "is %d characters long, more than the %d allowed", len(t), maxLen)
	case t == "." || t == "..":
		return feed.Invalid(field, "%q is not a topic name Kafka accepts", t)
	case !topicRe.MatchString(t):
		return feed.Invalid(field, "%q has a character other than ASCII letters, digits, '.', '_' and '-'", t)
	}
	return nil
}

// resolve fills the defaults and validates the result, naming the field.
func (o Options) resolve() (Options, error) {
	if len(o.Brokers) == 0 {
		return o, feed.Invalid("kafka.brokers", "must name at least one seed broker (host:port)")
	}
	for i, b := range o.Brokers {
		if b == "" {
			return o, feed.Invalid(fmt.Sprintf("kafka.brokers[%d]", i), "must not be empty")
		}
	}
	if o.Feed == "" {
		return o, feed.Invalid("kafka.feed", "must not be empty; every record carries it in its kairos-feed header")
	}
	if err := o.Feed.Validate(); err != nil {
		return o, feed.Invalid("kafka.feed", "%v", err)
	}
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if err := validTopic("kafka.topic", o.Topic, MaxTopicLen); err != nil {
		return o, err
	}
	if o.Partitions < 0 {
		return o, feed.Invalid("kafka.partitions", "is %d; it must be 0 (the broker's default) or more", o.Partitions)
	}
	if o.ReplicationFactor < 0 {
		return o, feed.Invalid("kafka.replication_factor", "is %d; it must be 0 (the broker's default) or more", o.ReplicationFactor)
	}
	if o.MaxMessageBytes != 0 && o.MaxMessageBytes < 2*recordReserve {
		return o, feed.Invalid("kafka.max_message_bytes", "is %d; it must be 0 (the broker's default) or at least %d, to leave room for a document", o.MaxMessageBytes, 2*recordReserve)
	}
	return o, nil
}
