package webhook

import (
	"encoding/base64"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of Options. Each is what a zero field means.
const (
	// DefaultTimeout bounds one delivery (connect, send, answer). The
	// worker's own deadline for the sink call bounds it too; this one keeps
	// a receiver that hangs from holding a call for the whole of it.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBodyBytes bounds one delivery's body. Common receivers (web
	// frameworks, API gateways) refuse bodies past a few MiB by default.
	DefaultMaxBodyBytes = 4 << 20
	// MinMaxBodyBytes is the smallest body limit accepted: a body must hold
	// its envelope, the longest key and a document of a few KiB.
	MinMaxBodyBytes = 16 << 10
	// DefaultTolerance is how far a delivery's webhook-timestamp may be from
	// the receiver's clock before Verify refuses it (a replay).
	DefaultTolerance = 5 * time.Minute
	// SecretPrefix starts every secret: Standard Webhooks' whsec_ followed by
	// the key in base64.
	SecretPrefix = "whsec_"
)

// Options configure a Sink. Feed, Sink, URL and Secrets are required; the
// other fields' zero values mean their defaults. Every field is a plain value,
// so a config file can build one.
type Options struct {
	// URL is where deliveries are POSTed: http or https. Credentials in it
	// (user:password@) are sent as basic auth, and a query (a token) is sent
	// as given; neither ever appears in an error, a log line or a park
	// reason (see "Secrets in the URL" in the package doc). Required.
	URL string
	// Secrets sign every delivery, each "whsec_" and a base64 key; every
	// secret adds a signature, so a receiver can rotate its secret: add the
	// new one here, switch the receiver, then drop the old one. At least one.
	Secrets []string
	// Feed and Sink name the pair in every delivery, so one receiver can
	// serve many. Required, and must be what the worker runs under.
	Feed feed.FeedName
	Sink feed.SinkName
	// Timeout bounds one delivery. Defaults to DefaultTimeout.
	Timeout time.Duration
	// MaxBodyBytes bounds a delivery's body: a batch is split into
	// deliveries that each stay under it, and a record whose document is
	// larger than Sink.MaxDocumentBytes (this less a reserve of a few KiB for
	// the envelope and the key) is rejected. At least MinMaxBodyBytes.
	// Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int
	// AllowLoopback lets deliveries reach loopback addresses (127.0.0.0/8,
	// ::1), for tests and a receiver on the same host. Defaults to false.
	AllowLoopback bool
	// AllowPrivate lets deliveries reach private, link-local, unique-local,
	// shared (100.64.0.0/10) and cloud-metadata addresses, for a receiver
	// inside the same network. Defaults to false.
	AllowPrivate bool
	// Logger receives what a receiver answered that the sink could not
	// read. Defaults to slog.Default().
	Logger *slog.Logger
}

// config is Options resolved: parsed and defaulted.
type config struct {
	Options
	url     *url.URL
	keys    [][]byte
	redact  redactor
	display string // the URL as errors show it
}

// resolve validates o and fills the defaults, naming the field of anything
// wrong and never repeating a secret or the URL's credentials.
func (o Options) resolve() (*config, error) {
	const p = "webhook."
	c := &config{Options: o}
	if o.URL == "" {
		return nil, feed.Invalid(p+"url", "must be set")
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		// url's error repeats the URL, credentials included: say less.
		return nil, feed.Invalid(p+"url", "is not a URL")
	}
	c.redact = newRedactor(u)
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, feed.Invalid(p+"url", "%s has no http or https scheme", c.redact.url(u))
	case u.Host == "" || u.Hostname() == "":
		return nil, feed.Invalid(p+"url", "%s has no host", c.redact.url(u))
	case u.Fragment != "":
		return nil, feed.Invalid(p+"url", "%s has a fragment, which is never sent", c.redact.url(u))
	}
	c.url, c.display = u, c.redact.url(u)
	if len(o.Secrets) == 0 {
		return nil, feed.Invalid(p+"secrets", "must hold at least one %s secret", SecretPrefix)
	}
	for i, s := range o.Secrets {
		key, err := decodeSecret(s)
		if err != nil {
			return nil, feed.Invalid(p+"secrets["+itoa(i)+"]", "%v", err)
		}
		c.keys = append(c.keys, key)
	}
	if err := o.Feed.Validate(); err != nil {
		return nil, renamed(err, p+"feed")
	}
	if err := o.Sink.Validate(); err != nil {
		return nil, renamed(err, p+"sink")
	}
	switch {
	case o.Timeout < 0:
		return nil, feed.Invalid(p+"timeout", "is %v; it must be positive (0 for the default %v)", o.Timeout, DefaultTimeout)
	case o.Timeout == 0:
		c.Timeout = DefaultTimeout
	}
	switch {
	case o.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case o.MaxBodyBytes < MinMaxBodyBytes:
		return nil, feed.Invalid(p+"max_body_bytes", "is %d; it must be at least %d (0 for the default %d)", o.MaxBodyBytes, MinMaxBodyBytes, DefaultMaxBodyBytes)
	}
	if o.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// decodeSecret reads a whsec_ secret; its error never repeats the secret.
func decodeSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, SecretPrefix)
	switch {
	case s == "":
		return nil, errorf("is empty")
	case !ok:
		return nil, errorf("does not start with %s", SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	switch {
	case err != nil:
		return nil, errorf("is not %s followed by base64", SecretPrefix)
	case len(key) < 16:
		return nil, errorf("holds a key of %d bytes; at least 16 are needed", len(key))
	}
	return key, nil
}

// renamed gives an *feed.InvalidError the field name of the options.
func renamed(err error, field string) error {
	if ie, ok := err.(*feed.InvalidError); ok {
		return &feed.InvalidError{Field: field, Reason: ie.Reason, Err: ie.Err}
	}
	return err
}
