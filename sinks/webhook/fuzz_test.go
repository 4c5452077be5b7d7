package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzKey makes a key of at least 16 bytes (what a secret must hold) from
// the fuzzer's bytes, and its secret.
func fuzzKey(b []byte) ([]byte, string) {
	key := append(bytes.Repeat([]byte{0x5a}, max(0, 16-len(b))), b...)
	return key, SecretPrefix + base64.StdEncoding.EncodeToString(key)
}

// flip changes the byte at pos (modulo len) of s by xor with d (never 0).
func flip(s []byte, pos uint, d byte) []byte {
	out := bytes.Clone(s)
	out[pos%uint(len(out))] ^= max(d, 1)
	return out
}

// FuzzSignVerify: a delivery the sink signs verifies, at any timestamp
// within the tolerance, under each of its secrets, and its signature is the
// one Standard Webhooks defines (the pooled signer agrees with the plain
// HMAC); a change of any single byte of the body, the id, the timestamp or
// the signature header makes it fail with ErrSignature, and so does another
// secret.
func FuzzSignVerify(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), "msg_00000000000000000000000000000000", int64(1_700_000_000), []byte(`{"type":"apply","records":[]}`), uint(0), byte(1), int64(0))
	f.Add([]byte{}, "x", int64(0), []byte{}, uint(7), byte(0x80), int64(299))
	f.Add([]byte("k"), "a.b", int64(-5), []byte("."), uint(1), byte(' '), int64(-300))
	f.Fuzz(func(t *testing.T, kb []byte, id string, sec int64, body []byte, pos uint, d byte, skew int64) {
		if id == "" || sec < -1<<40 || sec > 1<<40 { // an id is always set; a timestamp within 35,000 years
			return
		}
		key, secret := fuzzKey(kb)
		_, other := fuzzKey(append(bytes.Clone(kb), 1))
		ts := strconv.FormatInt(sec, 10)
		s := &Sink{signers: []*signer{newSigner(key), newSigner([]byte("another key of 16+ bytes"))}}
		header := s.sign(id, ts, body)
		first, _, _ := strings.Cut(header, " ")
		if first != "v1,"+signature(key, id, ts, body) {
			t.Fatalf("the pooled signer says %s, the plain HMAC %s", first, signature(key, id, ts, body))
		}
		now := time.Unix(sec, 0).Add(time.Duration(skew%300) * time.Second)
		h := func(id, ts, sig string) http.Header {
			return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
		}
		if err := verifyAt([]string{secret}, h(id, ts, header), body, 0, now); err != nil {
			t.Fatalf("a signed delivery does not verify: %v", err)
		}
		if err := verifyAt([]string{other, secret}, h(id, ts, first), body, 0, now); err != nil {
			t.Fatalf("a signed delivery does not verify with its secret second in the list: %v", err)
		}
		fails := func(what string, hd http.Header, b []byte, secrets ...string) {
			t.Helper()
			if err := verifyAt(secrets, hd, b, 0, now); !errors.Is(err, ErrSignature) {
				t.Fatalf("%s: verify = %v; want ErrSignature", what, err)
			}
		}
		fails("another secret", h(id, ts, header), body, other)
		if len(body) > 0 {
			fails("a byte of the body changed", h(id, ts, first), flip(body, pos, d), secret)
		}
		fails("a byte of the id changed", h(string(flip([]byte(id), pos, d)), ts, first), body, secret)
		fails("a byte of the timestamp changed", h(id, string(flip([]byte(ts), pos, d)), first), body, secret)
		fails("a byte of the signature changed", h(id, ts, string(flip([]byte(first), pos, d))), body, secret)
	})
}

// FuzzVerifyHostile sends whatever headers and body to Verify and to the
// receiver's Handler: neither panics, Verify accepts only a delivery that
// carries the right v1 signature of its own id, timestamp and body, with a
// timestamp within the tolerance, and neither an error nor an answer ever
// repeats the secret or its key.
func FuzzVerifyHostile(f *testing.F) {
	key, secret := fuzzKey([]byte("hostile-headers-key"))
	good := "v1," + signature(key, "msg_1", "1700000000", []byte("{}"))
	f.Add("msg_1", "1700000000", good, []byte("{}"))
	f.Add("msg_1", "1600000000", "v1,"+signature(key, "msg_1", "1600000000", []byte("{}")), []byte("{}")) // signed, but long ago
	f.Add("", "", "", []byte{})
	f.Add("msg_1", "1700000000", good+" v1,"+good, []byte("{}"))
	f.Add("msg_1", "+1700000000", good, []byte("{}"))
	f.Add("msg_1", "99999999999999999999", "v1", []byte(nil))
	f.Add("msg\r\n1", "-1", "v2,"+good[3:]+" v1,", []byte("{}"))
	f.Add("msg_1", "1700000000", "  v1,,  ,v1 "+secret, []byte(`{"type":"apply","records":[{"key":"k","seq":1}]}`))
	f.Add("m", "1700000000", strings.Repeat("v1,", 1000), bytes.Repeat([]byte("["), 10000))
	now := time.Unix(1_700_000_000, 0)
	b64 := base64.StdEncoding.EncodeToString(key)
	handler, err := NewHandler([]string{secret}, HandlerOptions{MaxBodyBytes: 1 << 16}, func(context.Context, Delivery) ([]Rejected, error) { return nil, nil })
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		hd := http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig}}
		err := verifyAt([]string{secret}, hd, body, 0, now)
		if err == nil {
			sec, perr := strconv.ParseInt(ts, 10, 64)
			d := now.Sub(time.Unix(sec, 0))
			want := "v1," + signature(key, id, ts, body)
			if id == "" || perr != nil || d > DefaultTolerance || d < -DefaultTolerance || !slices.Contains(strings.Fields(sig), want) {
				t.Fatalf("verified id %q ts %q sig %q body %q", id, ts, sig, body)
			}
		} else if !errors.Is(err, ErrSignature) || strings.Contains(err.Error(), b64) || strings.Contains(err.Error(), secret) {
			t.Fatalf("verify = %v; want ErrSignature, without the secret", err)
		}
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header = hd
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			t.Fatalf("the handler took id %q ts %q sig %q, signed for a time long gone", id, ts, sig)
		}
		if out := w.Body.String(); strings.Contains(out, b64) || strings.Contains(out, secret) {
			t.Fatalf("the handler's answer repeats the secret: %q", out)
		}
	})
}
