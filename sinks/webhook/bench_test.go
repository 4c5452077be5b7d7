package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// benchReceiver reads each body and answers 204: what is measured is the
// sender's side.
func benchReceiver(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchBatch(seq feed.Seq) []feed.Record {
	doc := `{"name":"` + strings.Repeat("n", 240) + `","qty":12,"price":"19.90"}`
	out := make([]feed.Record, 500)
	for i := range out {
		out[i] = feed.Record{Key: feed.Key(fmt.Sprintf("order-%06d", i)), Seq: seq + feed.Seq(i), Doc: []byte(doc)}
	}
	return out
}

// BenchmarkApply is the sink's apply rate at batch 500, 300-byte documents.
func BenchmarkApply(b *testing.B) {
	srv := benchReceiver(b)
	s, err := webhook.New(b.Context(), opts(srv.URL))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := benchBatch(1)
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Apply(b.Context(), batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkRawPost is its baselines: plain POSTs of the same payload to the
// same receiver, built once and unsigned (the issue's), and what a
// hand-written Standard Webhooks sender does per delivery: encode the body
// from the records into a reused buffer, sign it under one HMAC state, and
// send it with the three headers.
func BenchmarkRawPost(b *testing.B) {
	b.Run("unsigned", func(b *testing.B) { rawPost(b, false) })
	b.Run("signed", func(b *testing.B) { rawPost(b, true) })
}

func appendBody(b []byte, recs []feed.Record) []byte {
	b = append(b, `{"type":"apply","feed":"orders","sink":"hook","records":[`...)
	for i, r := range recs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = strconv.AppendQuote(b, string(r.Key)) // printable ASCII: as JSON quotes it
		b = append(b, `,"seq":`...)
		b = strconv.AppendInt(b, int64(r.Seq), 10)
		b = append(append(append(b, `,"doc":`...), r.Doc...), '}')
	}
	return append(b, "]}"...)
}

func rawPost(b *testing.B, signed bool) {
	srv := benchReceiver(b)
	batch := benchBatch(1)
	payload := appendBody(nil, batch)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	var buf []byte
	n := 0
	b.ResetTimer()
	for b.Loop() {
		body := payload
		var h http.Header
		if signed {
			n++
			buf = appendBody(buf[:0], batch)
			body = buf
			id, ts := "msg_"+strconv.Itoa(n), strconv.FormatInt(time.Now().Unix(), 10)
			mac.Reset()
			mac.Write([]byte(id + "." + ts + "."))
			mac.Write(body)
			h = http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {ts},
				"Webhook-Signature": {"v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))}}
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		for k, v := range h {
			req.Header[k] = v
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkHMAC is HMAC-SHA256's throughput over a delivery's body on this
// CPU, the one cost a signing sender cannot overlap with sending.
func BenchmarkHMAC(b *testing.B) {
	body := appendBody(nil, benchBatch(1))
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		mac.Reset()
		mac.Write(body)
		mac.Sum(nil)
	}
}
