package nats

import (
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Defaults and limits of Options.
const (
	// DefaultBucket is the pointer bucket a zero Options uses.
	DefaultBucket = "kairos"
	// MaxBucketLen is the longest Options.Bucket: the copies' buckets add
	// "-g", a generation of up to 19 digits, '-' and suffixLen hex digits,
	// and JetStream prefixes "KV_" to name the stream; 64 keeps every name
	// short enough for any store directory.
	MaxBucketLen = 64
	// DefaultWindow is how many publishes of one Apply may await their acks
	// at once.
	DefaultWindow = 256
	// MaxWindow bounds Options.Window.
	MaxWindow = 65536
	// DefaultAckTimeout bounds the wait for one publish's ack.
	DefaultAckTimeout = 10 * time.Second
	// DefaultHintKeys is how many keys' last stream sequences a sink
	// remembers per copy (see # The seq guard in the package doc).
	DefaultHintKeys = 100_000
	// DefaultReplicas is the replica count of the buckets the sink creates.
	DefaultReplicas = 1
	// MaxReplicas is JetStream's limit on a stream's replicas.
	MaxReplicas = 5
)

// Options configure a Sink. The zero value is valid and means every
// default. The fields are plain values, so that a config file can build a
// sink from `type: nats` plus these.
type Options struct {
	// Bucket names the sink: the KV bucket holding the pointer to the live
	// copy, and the stem of the copies' buckets (Bucket-g<generation>-<hex>).
	// 1 to MaxBucketLen bytes of ASCII letters, digits and '_' (no '-',
	// which separates the parts of a copy's name, so two sinks' copies can
	// never be taken for each other's). Defaults to DefaultBucket.
	Bucket string
	// Feed is written in each message's Kairos-Feed header and enters its
	// Nats-Msg-Id, so consumers of the bucket's stream can tell feeds apart
	// and the server's deduplication never mistakes two feeds' records for
	// each other. A feed name (feed.FeedName's rule). Defaults to Bucket.
	Feed string
	// Window is how many publishes one Apply keeps awaiting their acks at
	// once, 1 to MaxWindow. Defaults to DefaultWindow.
	Window int
	// AckTimeout bounds the wait for each publish's ack; a publish unacked
	// by then fails the call (a sink error). Defaults to DefaultAckTimeout.
	AckTimeout time.Duration
	// HintKeys is how many keys' last stream sequences each copy remembers
	// from its own writes, so that an update is one conditional publish
	// instead of a failed one, a read and a second; 0 means the default,
	// a negative value remembers none. Defaults to DefaultHintKeys.
	HintKeys int
	// Replicas is the replica count of the buckets the sink creates, 1 to
	// MaxReplicas (more than 1 needs a JetStream cluster). Defaults to
	// DefaultReplicas.
	Replicas int
	// MemoryStorage keeps the copies' buckets in memory instead of files:
	// faster, lost when the server restarts (a resync then rebuilds them,
	// but only once the worker finds out). Defaults to false.
	MemoryStorage bool
}

// resolve fills the defaults and validates the result, naming the field.
func (o Options) resolve() (Options, error) {
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if len(o.Bucket) > MaxBucketLen {
		return o, feed.Invalid("nats.bucket", "is %d bytes long, more than the %d allowed", len(o.Bucket), MaxBucketLen)
	}
	for i := 0; i < len(o.Bucket); i++ {
		if b := o.Bucket[i]; !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '_') {
			return o, feed.Invalid("nats.bucket", "%q has %q at byte %d; only ASCII letters, digits and '_' are allowed", o.Bucket, b, i)
		}
	}
	if o.Feed == "" {
		o.Feed = o.Bucket
	}
	if err := feed.FeedName(o.Feed).Validate(); err != nil {
		return o, feed.Invalid("nats.feed", "%q: %v", o.Feed, err)
	}
	switch {
	case o.Window == 0:
		o.Window = DefaultWindow
	case o.Window < 1 || o.Window > MaxWindow:
		return o, feed.Invalid("nats.window", "is %d; it must be 1 to %d", o.Window, MaxWindow)
	}
	switch {
	case o.AckTimeout == 0:
		o.AckTimeout = DefaultAckTimeout
	case o.AckTimeout < 0:
		return o, feed.Invalid("nats.ack_timeout", "is %v; it must be positive", o.AckTimeout)
	}
	switch {
	case o.HintKeys == 0:
		o.HintKeys = DefaultHintKeys
	case o.HintKeys < 0:
		o.HintKeys = 0
	}
	switch {
	case o.Replicas == 0:
		o.Replicas = DefaultReplicas
	case o.Replicas < 1 || o.Replicas > MaxReplicas:
		return o, feed.Invalid("nats.replicas", "is %d; it must be 1 to %d", o.Replicas, MaxReplicas)
	}
	return o, nil
}
