package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// testSecret is a whsec_ secret of 24 random-looking bytes.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// entry is a key's state in a receiver's copy: its seq, tombstones included.
type entry struct {
	seq feed.Seq
	doc json.RawMessage // nil: deleted
}

// write is one write a receiver's copy took, for the no-regress check.
type write struct {
	key feed.Key
	seq feed.Seq
}

// receiver is the receiver model the package doc describes: a live copy
// and one copy per open resync, each write guarded by seq and by its copy's
// floor, deliveries deduplicated by webhook-id with their first answer
// remembered.
type receiver struct {
	t         *testing.T
	rejectKey feed.Key

	mu      sync.Mutex
	live    map[feed.Key]entry
	floor   feed.Seq // the live copy's: the floor of the copy published last
	gen     feed.Generation
	shadows map[string]*shadow
	answers map[string][]webhook.Rejected // by webhook-id
	ids     map[string]int                // deliveries seen per id, repeats included
	applied map[string]int                // deliveries applied per id
	writes  []write                       // live writes, in order
	fault   func(w http.ResponseWriter) bool
	observe func(deliverySeen) // called, under mu, with every verified delivery
	hdrs    []http.Header
	bodies  [][]byte
	// maxBody is the handler's body limit; 0 for its default.
	maxBody int64
}

// shadow is a resync's copy, filled aside until its resync.publish.
type shadow struct {
	m     map[feed.Key]entry
	floor feed.Seq // the lowest seq of its first resync.apply with records, or resync.publish's floor
}

func newReceiver(t *testing.T) *receiver {
	return &receiver{t: t, live: map[feed.Key]entry{}, shadows: map[string]*shadow{},
		answers: map[string][]webhook.Rejected{}, ids: map[string]int{}, applied: map[string]int{}}
}

// serve starts the receiver on 127.0.0.1 behind the package's handler and
// returns its URL.
func (rc *receiver) serve(t *testing.T) (*httptest.Server, string) {
	h, err := webhook.NewHandler([]string{testSecret}, webhook.HandlerOptions{MaxBodyBytes: rc.maxBody}, rc.receive)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		f := rc.fault
		rc.mu.Unlock()
		if f != nil && f(w) {
			return
		}
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.hdrs = append(rc.hdrs, r.Header.Clone())
		rc.bodies = append(rc.bodies, body)
		rc.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, srv.URL + "/hook"
}

func (rc *receiver) setFault(f func(w http.ResponseWriter) bool) {
	rc.mu.Lock()
	rc.fault = f
	rc.mu.Unlock()
}

func (rc *receiver) receive(_ context.Context, d webhook.Delivery) ([]webhook.Rejected, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.ids[d.ID]++
	if rc.observe != nil {
		rc.observe(deliverySeen{typ: d.Type, records: d.Records})
	}
	if a, ok := rc.answers[d.ID]; ok {
		return a, nil // a repeat: the first answer again
	}
	var rejs []webhook.Rejected
	switch d.Type {
	case webhook.TypeApply:
		rejs = rc.apply(rc.live, rc.floor, d.Records, true)
	case webhook.TypeResyncBegin:
		rc.shadows[d.Resync] = &shadow{m: map[feed.Key]entry{}}
	case webhook.TypeResyncApply:
		sh, ok := rc.shadows[d.Resync]
		if !ok {
			return nil, fmt.Errorf("no resync %s open", d.Resync)
		}
		if sh.floor == 0 && len(d.Records) > 0 {
			sh.floor = d.Records[0].Seq
			for _, r := range d.Records {
				sh.floor = min(sh.floor, r.Seq)
			}
		}
		rejs = rc.apply(sh.m, sh.floor, d.Records, false)
	case webhook.TypeResyncPublish:
		sh, ok := rc.shadows[d.Resync]
		if !ok {
			return nil, fmt.Errorf("no resync %s open", d.Resync)
		}
		if sh.floor == 0 {
			sh.floor = d.Floor // a copy sent no record: the worker's floor
		}
		rc.live, rc.floor, rc.gen = sh.m, sh.floor, d.Generation
		delete(rc.shadows, d.Resync)
		for k, e := range sh.m {
			rc.writes = append(rc.writes, write{k, e.seq})
		}
	case webhook.TypeResyncAbort:
		delete(rc.shadows, d.Resync)
	default:
		return nil, fmt.Errorf("unknown type %q", d.Type)
	}
	rc.answers[d.ID] = rejs
	rc.applied[d.ID]++
	return rejs, nil
}

// apply is the seq guard: a record older than the key's stored seq,
// tombstones included, or below the copy's floor, changes nothing.
func (rc *receiver) apply(m map[feed.Key]entry, floor feed.Seq, recs []feed.Record, live bool) []webhook.Rejected {
	var rejs []webhook.Rejected
	for _, r := range recs {
		if rc.rejectKey != "" && r.Key == rc.rejectKey {
			rejs = append(rejs, webhook.Rejected{Key: r.Key, Reason: "this receiver refuses " + string(r.Key)})
			continue
		}
		if old, ok := m[r.Key]; (ok && old.seq > r.Seq) || r.Seq < floor {
			continue
		}
		m[r.Key] = entry{seq: r.Seq, doc: append(json.RawMessage(nil), r.Doc...)}
		if r.Doc == nil {
			m[r.Key] = entry{seq: r.Seq}
		}
		if live {
			rc.writes = append(rc.writes, write{r.Key, r.Seq})
		}
	}
	return rejs
}

func (rc *receiver) contents(context.Context) (map[feed.Key]json.RawMessage, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, e := range rc.live {
		if e.doc != nil {
			out[k] = e.doc
		}
	}
	return out, nil
}

// standardVerify is an independent reading of the Standard Webhooks spec,
// written here rather than borrowed from the package: the signed content is
// "{id}.{timestamp}.{body}", signed with HMAC-SHA256 under the base64 key
// after "whsec_", and the header lists space-delimited "v1,{base64}"
// signatures.
func standardVerify(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp")
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(n, 0)).Abs() > 5*time.Minute {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, part := range strings.Split(h.Get("Webhook-Signature"), " ") {
		if strings.HasPrefix(part, "v1,") && hmac.Equal([]byte(part[3:]), []byte(want)) {
			return nil
		}
	}
	return fmt.Errorf("no signature matches")
}

type deliverySeen struct {
	typ     string
	records []feed.Record
}
