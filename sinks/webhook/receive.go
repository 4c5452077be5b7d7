package webhook

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// ErrSignature: a delivery's signature, id or timestamp did not verify.
var ErrSignature = errors.New("webhook: delivery not verified")

// Verify checks a delivery as a receiver got it: headers webhook-id,
// webhook-timestamp (within tolerance of now; 0 means DefaultTolerance) and
// webhook-signature, one of whose v1 signatures must be the HMAC-SHA256 of
// "id.timestamp.body" under secret (whsec_…). Its errors match ErrSignature
// and never repeat the secret.
func Verify(secret string, headers http.Header, body []byte, tolerance time.Duration) error {
	return verifyAt([]string{secret}, headers, body, tolerance, time.Now())
}

func verifyAt(secrets []string, h http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: webhook-id, webhook-timestamp or webhook-signature missing", ErrSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: webhook-timestamp %q is not a number of seconds", ErrSignature, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: webhook-timestamp is %v away from now, more than %v", ErrSignature, d.Round(time.Second), tolerance)
	}
	for i, s := range secrets {
		key, err := decodeSecret(s)
		if err != nil {
			return fmt.Errorf("%w: secret %d %v", ErrSignature, i, err)
		}
		want := []byte(signature(key, id, ts, body))
		for _, sig := range strings.Fields(sigs) {
			v, b64, ok := strings.Cut(sig, ",")
			if ok && v == "v1" && hmac.Equal([]byte(b64), want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: no v1 signature matches", ErrSignature)
}

// Delivery is one delivery as a receiver decodes it.
type Delivery struct {
	// ID is the webhook-id: the same on every retry of the delivery.
	ID string
	// Type is one of TypeApply, TypeResyncBegin, TypeResyncApply,
	// TypeResyncPublish and TypeResyncAbort.
	Type string
	Feed feed.FeedName
	Sink feed.SinkName
	// Generation is the generation of the copy the delivery is for: always
	// set in resync deliveries; in apply deliveries, the last generation the
	// sending process published, 0 when it has published none.
	Generation feed.Generation
	// Resync identifies one resync: every resync delivery of it carries it,
	// and a new OpenResync, even for the same generation, has a new one.
	Resync string
	// Floor, on a resync.publish, is the floor the worker gave a copy that
	// was sent no record (feed.FloorSetter); 0 otherwise. A receiver that
	// keeps the floor makes it the copy's when the copy has none (see
	// # Guarantees in the package doc).
	Floor feed.Seq
	// Records are the records, in seq order; a nil Doc is a deletion.
	Records []feed.Record
}

// wire is a delivery's body as sent.
type wire struct {
	Type       string          `json:"type"`
	Feed       feed.FeedName   `json:"feed"`
	Sink       feed.SinkName   `json:"sink"`
	Generation feed.Generation `json:"generation"`
	Resync     string          `json:"resync"`
	Floor      feed.Seq        `json:"floor"`
	Records    []struct {
		Key     feed.Key        `json:"key"`
		Seq     feed.Seq        `json:"seq"`
		Doc     json.RawMessage `json:"doc"`
		Deleted bool            `json:"deleted"`
	} `json:"records"`
}

// Decode reads a verified delivery's body.
func Decode(id string, body []byte) (Delivery, error) {
	var w wire
	if err := json.Unmarshal(body, &w); err != nil {
		return Delivery{}, fmt.Errorf("webhook: the delivery is not JSON of the delivery format: %w", err)
	}
	d := Delivery{ID: id, Type: w.Type, Feed: w.Feed, Sink: w.Sink, Generation: w.Generation, Resync: w.Resync, Floor: w.Floor, Records: make([]feed.Record, len(w.Records))}
	for i, r := range w.Records {
		d.Records[i] = feed.Record{Key: r.Key, Seq: r.Seq}
		if !r.Deleted {
			if r.Doc == nil {
				return Delivery{}, fmt.Errorf("webhook: record %d has neither a document nor deleted", i)
			}
			d.Records[i].Doc = r.Doc
		}
	}
	return d, nil
}

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Tolerance is how far a delivery's timestamp may be from now.
	// Defaults to DefaultTolerance.
	Tolerance time.Duration
	// MaxBodyBytes bounds a body read; a larger one is answered 413.
	// Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
}

// ReceiveFunc handles one verified, decoded delivery. It returns the records
// it refuses (parked by the sending worker) or an error, which answers 500 so
// the sender retries the delivery later, with the same ID.
type ReceiveFunc func(ctx context.Context, d Delivery) ([]Rejected, error)

// NewHandler returns an http.Handler for a receiver: it verifies each POST
// against any of secrets (a receiver rotating its secret lists both), decodes
// it and hands it to f, and answers f's rejections as the sink reads them.
// Unsigned or badly signed requests are answered 401, which the sink retries
// and never parks on.
func NewHandler(secrets []string, opts HandlerOptions, f ReceiveFunc) (http.Handler, error) {
	if len(secrets) == 0 {
		return nil, feed.Invalid("webhook.handler.secrets", "must hold at least one %s secret", SecretPrefix)
	}
	for i, s := range secrets {
		if _, err := decodeSecret(s); err != nil {
			return nil, feed.Invalid("webhook.handler.secrets["+itoa(i)+"]", "%v", err)
		}
	}
	if f == nil {
		return nil, feed.Invalid("webhook.handler.f", "must not be nil")
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	secrets = append([]string(nil), secrets...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "deliveries are POSTed", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, opts.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "reading the body failed", http.StatusInternalServerError)
			return
		}
		if err := verifyAt(secrets, r.Header, body, opts.Tolerance, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		d, err := Decode(r.Header.Get("webhook-id"), body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rejs, err := f(r.Context(), d)
		if err != nil {
			http.Error(w, "the receiver failed; retry later", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if rejs == nil {
			rejs = []Rejected{}
		}
		_ = json.NewEncoder(w).Encode(answer{Rejected: rejs})
	}), nil
}
