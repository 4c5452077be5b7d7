package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/kairos-es/kairos/sinks/webhook"
)

// benchSecret signs the webhook row's deliveries; it guards nothing.
const benchSecret = "whsec_a2Fpcm9zLWJlbmNoLXNlY3JldC1rZXk="

// measureWebhook measures sinks/webhook's apply rate at batch SinkApplyBatch
// (300-byte documents) into a receiver on 127.0.0.1 that drains each body
// and answers 204, against plain POSTs of a payload of the same records to
// the same receiver, built once and sent unsigned: what a hand-written
// sender without the signature, the ids and the answer handling costs.
func (e *env) measureWebhook(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	recs := sinkRecords(sz.SinkApplyRecs)
	var payloads [][]byte
	for c := 0; c < len(recs); c += sz.SinkApplyBatch {
		var b bytes.Buffer
		b.WriteString(`{"type":"apply","feed":"bench","sink":"hook","records":[`)
		for j, r := range recs[c:min(len(recs), c+sz.SinkApplyBatch)] {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"key":%q,"seq":%d,"doc":%s}`, r.Key, r.Seq, r.Doc)
		}
		b.WriteString("]}")
		payloads = append(payloads, b.Bytes())
	}
	client := &http.Client{}
	defer client.CloseIdleConnections()
	var rates, base []float64
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
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(p))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return nil, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		base = append(base, float64(len(recs))/time.Since(start).Seconds())
	}
	return []Row{newRow("S webhook", fmt.Sprintf("sink apply rate at batch %d: sinks/webhook (signed) into a draining receiver on 127.0.0.1; baseline: plain unsigned POSTs of the same records", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}
