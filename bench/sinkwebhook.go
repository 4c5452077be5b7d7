package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// benchSecret signs the webhook rows' deliveries; it guards nothing.
const benchSecret = "whsec_a2Fpcm9zLWJlbmNoLXNlY3JldC1rZXk="

// measureWebhook measures sinks/webhook's apply rate at batch SinkApplyBatch
// (300-byte documents) into a receiver on 127.0.0.1 that drains each body
// and answers 204, and beside it, in the same runs:
//
//   - "S webhook": the baseline, plain POSTs of a payload of the same
//     records to the same receiver, built once and sent unsigned;
//   - "S webhook signed": what a hand-written Standard Webhooks sender must
//     do per delivery: encode the body from the records (into a reused
//     buffer), sign it (one HMAC state, reset per delivery) and POST it with
//     webhook-id, webhook-timestamp and webhook-signature;
//   - "S webhook hmac": HMAC-SHA256 throughput over the same bodies, against
//     the unsigned POSTs' throughput, both in MB/s. Signing must finish
//     before the first byte of a delivery goes out (the signature is a
//     header), so no signing sender can beat h/(h+p) of the unsigned rate,
//     h and p being the two throughputs: that is the row's ratio.
func (e *env) measureWebhook(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	recs := sinkRecords(sz.SinkApplyRecs)
	var payloads [][]byte
	var payloadBytes int
	for c := 0; c < len(recs); c += sz.SinkApplyBatch {
		p := appendBody(nil, recs[c:min(len(recs), c+sz.SinkApplyBatch)])
		payloads = append(payloads, p)
		payloadBytes += len(p)
	}
	key, err := base64.StdEncoding.DecodeString(benchSecret[len("whsec_"):])
	if err != nil {
		return nil, err
	}
	client := &http.Client{}
	defer client.CloseIdleConnections()
	post := func(body []byte, h http.Header) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		for k, v := range h {
			req.Header[k] = v
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("the receiver answered %d", resp.StatusCode)
		}
		return nil
	}
	var rates, unsigned, signed, hmacMBps, postMBps []float64
	for range sz.Runs {
		sink, err := webhook.New(ctx, webhook.Options{URL: srv.URL, Secrets: []string{benchSecret}, Feed: "bench", Sink: "hook", AllowLoopback: true})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "the receiver", sink, recs, sz.SinkApplyBatch)
		sink.Close()
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		start := time.Now()
		for _, p := range payloads {
			if err := post(p, nil); err != nil {
				return nil, err
			}
		}
		d := time.Since(start).Seconds()
		unsigned = append(unsigned, float64(len(recs))/d)
		postMBps = append(postMBps, float64(payloadBytes)/1e6/d)

		hs := newHandSigner(key)
		start = time.Now()
		for c := 0; c < len(recs); c += sz.SinkApplyBatch {
			body, h := hs.delivery(recs[c:min(len(recs), c+sz.SinkApplyBatch)])
			if err := post(body, h); err != nil {
				return nil, err
			}
		}
		signed = append(signed, float64(len(recs))/time.Since(start).Seconds())

		start = time.Now()
		for _, p := range payloads {
			hs.sign("msg_0123456789abcdef0123456789abcdef", "1700000000", p)
		}
		hmacMBps = append(hmacMBps, float64(payloadBytes)/1e6/time.Since(start).Seconds())
	}
	what := fmt.Sprintf("sink apply rate at batch %d: sinks/webhook (signed) into a draining receiver on 127.0.0.1", sz.SinkApplyBatch)
	return []Row{
		newRow("S webhook", what+"; baseline: plain unsigned POSTs of the same records, built once",
			"records/s", rates, unsigned, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 }),
		newRow("S webhook signed", what+"; baseline: a hand-written Standard Webhooks sender, each body encoded from the records and signed",
			"records/s", rates, signed, "figure/baseline", div, "", nil),
		newRow("S webhook hmac", "HMAC-SHA256 over the same bodies on this CPU; baseline: the unsigned POSTs' throughput; ratio: the most a signing sender can reach of the unsigned rate",
			"MB/s", hmacMBps, postMBps, "h/(h+p)", func(h, p float64) float64 { return h / (h + p) }, "", nil),
	}, nil
}

// appendBody appends an apply delivery's body of recs, as the sink writes
// it: keys here are printable ASCII, which strconv quotes as JSON does.
func appendBody(b []byte, recs []feed.Record) []byte {
	b = append(b, `{"type":"apply","feed":"bench","sink":"hook","records":[`...)
	for j, r := range recs {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = strconv.AppendQuote(b, string(r.Key))
		b = append(b, `,"seq":`...)
		b = strconv.AppendInt(b, int64(r.Seq), 10)
		b = append(b, `,"doc":`...)
		b = append(b, r.Doc...)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// handSigner is a careful hand-written Standard Webhooks sender: one body
// buffer and one HMAC state for all its deliveries, a counter for ids.
type handSigner struct {
	mac  hash.Hash
	body []byte
	n    int
}

func newHandSigner(key []byte) *handSigner {
	return &handSigner{mac: hmac.New(sha256.New, key)}
}

// delivery encodes recs and returns the body and its signed headers; the
// body is valid until the next call.
func (h *handSigner) delivery(recs []feed.Record) ([]byte, http.Header) {
	h.n++
	h.body = appendBody(h.body[:0], recs)
	id := "msg_" + strconv.Itoa(h.n)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	return h.body, http.Header{
		"Webhook-Id":        {id},
		"Webhook-Timestamp": {ts},
		"Webhook-Signature": {"v1," + h.sign(id, ts, h.body)},
	}
}

// sign is the spec's v1 signature: base64 of HMAC-SHA256 over id.ts.body.
func (h *handSigner) sign(id, ts string, body []byte) string {
	h.mac.Reset()
	h.mac.Write([]byte(id + "." + ts + "."))
	h.mac.Write(body)
	return base64.StdEncoding.EncodeToString(h.mac.Sum(nil))
}
