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
	"strings"
	"testing"

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

// BenchmarkRawPost is its baseline: plain POSTs of the same payload to the
// same receiver, built once, unsigned and signed.
func BenchmarkRawPost(b *testing.B) {
	b.Run("unsigned", func(b *testing.B) { rawPost(b, false) })
	b.Run("signed", func(b *testing.B) { rawPost(b, true) })
}

func rawPost(b *testing.B, signed bool) {
	srv := benchReceiver(b)
	var body bytes.Buffer
	body.WriteString(`{"type":"apply","feed":"orders","sink":"hook","records":[`)
	for i, r := range benchBatch(1) {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"key":%q,"seq":%d,"doc":%s}`, r.Key, r.Seq, r.Doc)
	}
	body.WriteString("]}")
	payload := body.Bytes()
	client := &http.Client{}
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	b.ResetTimer()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
		if signed {
			mac := hmac.New(sha256.New, key)
			mac.Write([]byte("msg_1.1700000000."))
			mac.Write(payload)
			req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64(b.N*500)/b.Elapsed().Seconds(), "records/s")
}
