package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// secretForms are the ways a planted secret could leak: as written, escaped
// for a URL, and inside a basic-auth header (user:secret in base64).
func secretForms(secret string) []string {
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret)}
	for _, user := range []string{"app", "kairos", "root", ""} {
		forms = append(forms, base64.StdEncoding.EncodeToString([]byte(user+":"+secret)))
	}
	return forms
}

// wantNoSecret fails t if text holds secret in any of its forms.
func wantNoSecret(t *testing.T, where, text, secret string) {
	t.Helper()
	for _, f := range secretForms(secret) {
		if strings.Contains(text, f) {
			t.Errorf("%s repeats the secret (as %q):\n%s", where, f, text)
			return
		}
	}
}

// echoReceiver is a webhook receiver at its worst: it answers every request
// with status, its body repeating the request's URL (its query's token
// included), its Authorization header and that header decoded. A 200
// answer rejects the delivery's first record with such a reason.
func echoReceiver(t *testing.T, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		dec, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
		echo := fmt.Sprintf("you sent %s with %s, that is %s", r.URL.String(), auth, dec)
		if r.Method != http.MethodPost || status != http.StatusOK {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, echo)
			return
		}
		var d struct {
			Records []struct {
				Key string `json:"key"`
			} `json:"records"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &d)
		out := struct {
			Rejected []map[string]string `json:"rejected"`
		}{Rejected: []map[string]string{}}
		if len(d.Records) > 0 {
			out.Rejected = append(out.Rejected, map[string]string{"key": d.Records[0].Key, "reason": echo})
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestSecretsNeverEchoedByTheSinks plants a password or token in every DSN,
// URL and secret a sink's section takes, builds the sink against a target
// that is unreachable and against one that answers and refuses, and
// requires that the secret appears neither in the error, nor in what the
// sink logged, nor, where the sink got as far as sending, in its sink
// errors and park reasons. The bleve and file sinks take no secret.
func TestSecretsNeverEchoedByTheSinks(t *testing.T) {
	srv := servers(t)
	const secret = "Pl4nted-s3cret-Xq9"
	closed := pgtest.ClosedPort(t)
	dir := t.TempDir()
	creds := filepath.Join(dir, "bad.creds")
	if err := os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\n"+secret+"\n------END NATS USER JWT------\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saslCluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "kairos", "the-right-one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(saslCluster.Close)
	pgHost := strings.TrimPrefix(srv.pg[strings.Index(srv.pg, "@")+1:], "")
	pgHost = pgHost[:strings.IndexByte(pgHost, '/')]
	mysqlAddr := srv.mysql[strings.Index(srv.mysql, "tcp(")+4 : strings.IndexByte(srv.mysql, ')')]
	redisAddr := strings.TrimSuffix(strings.TrimPrefix(srv.redis, "redis://"), "/0")
	natsAddr := strings.TrimPrefix(srv.nats, "nats://")
	hook := func(status int, path string) string {
		u, _ := url.Parse(echoReceiver(t, status).URL)
		u.User = url.UserPassword("app", secret)
		u.Path, u.RawQuery = path, "token="+secret
		return u.String()
	}
	const whsec = "[whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]"

	for _, tc := range []struct {
		name string
		sec  section
		// applies: the sink builds, and a record sent through it must fail
		// or park without the secret.
		applies bool
	}{
		{"pgtable unreachable", section{{"type", "pgtable"}, {"url", "postgres://app:" + secret + "@" + closed + "/app?connect_timeout=2"}, {"table", "t"}}, false},
		{"pgtable unreachable, keyword form", section{{"type", "pgtable"}, {"url", `"host=127.0.0.1 port=` + closed[strings.LastIndexByte(closed, ':')+1:] + ` user=app password=` + secret + ` dbname=app connect_timeout=2"`}, {"table", "t"}}, false},
		{"pgtable unparsable", section{{"type", "pgtable"}, {"url", "postgres://app:" + secret + "@h:notaport/app"}, {"table", "t"}}, false},
		{"pgtable refusing: no such role", section{{"type", "pgtable"}, {"url", "postgres://kairos_no_such_role:" + secret + "@" + pgHost + "/postgres?connect_timeout=5"}, {"table", "t"}}, false},
		{"mysql unreachable", section{{"type", "mysql"}, {"dsn", `"app:` + secret + `@tcp(` + closed + `)/test?timeout=2s"`}, {"table", "t"}}, false},
		{"mysql unparsable", section{{"type", "mysql"}, {"dsn", `"app:` + secret + `@tcp(` + mysqlAddr + `"`}, {"table", "t"}}, false},
		{"mysql refusing: wrong password", section{{"type", "mysql"}, {"dsn", `"root:` + secret + `@tcp(` + mysqlAddr + `)/test?timeout=5s"`}, {"table", "t"}}, false},
		{"redis unreachable", section{{"type", "redis"}, {"url", "redis://app:" + secret + "@" + closed + "/0?dial_timeout=2s"}}, false},
		{"redis unparsable", section{{"type", "redis"}, {"url", "redis://:" + secret + "@" + redisAddr + ":x/0"}}, false},
		{"redis refusing: no such user", section{{"type", "redis"}, {"url", "redis://kairos:" + secret + "@" + redisAddr + "/0"}}, false},
		{"nats unreachable, user and password", section{{"type", "nats"}, {"url", "nats://app:" + secret + "@" + closed}}, false},
		{"nats unreachable, token", section{{"type", "nats"}, {"url", "nats://" + secret + "@" + closed}}, false},
		{"nats unparsable", section{{"type", "nats"}, {"url", "nats://app:" + secret + "@" + natsAddr + ":x"}}, false},
		{"nats refusing: a credentials file it cannot read", section{{"type", "nats"}, {"url", srv.nats}, {"creds_file", creds}}, false},
		{"kafka unreachable", section{{"type", "kafka"}, {"brokers", "[" + closed + "]"}, {"create", "true"}, {"sasl", "{mechanism: plain, user: kairos, password: " + secret + "}"}}, false},
		{"kafka refusing: wrong SASL password", section{{"type", "kafka"}, {"brokers", "[" + saslCluster.ListenAddrs()[0] + "]"}, {"create", "true"}, {"sasl", "{mechanism: scram-sha-256, user: kairos, password: " + secret + "}"}}, false},
		{"kafka refusing: SASL where none is spoken", section{{"type", "kafka"}, {"brokers", "[" + srv.kafka + "]"}, {"create", "true"}, {"sasl", "{mechanism: plain, user: kairos, password: " + secret + "}"}}, false},
		{"webhook unreachable", section{{"type", "webhook"}, {"url", `"http://app:` + secret + `@` + closed + `/in?token=` + secret + `"`}, {"secrets", whsec}, {"allow_loopback", "true"}}, false},
		{"webhook unparsable", section{{"type", "webhook"}, {"url", `"http://app:` + secret + `@[::1/in"`}, {"secrets", whsec}}, false},
		{"webhook a signing secret that is not one", section{{"type", "webhook"}, {"url", "https://example.com/in"}, {"secrets", "[whsec_" + secret + "!]"}}, false},
		{"webhook a bare signing secret", section{{"type", "webhook"}, {"url", "https://example.com/in"}, {"secrets", "[" + secret + "]"}}, false},
		{"webhook refusing: 401", section{{"type", "webhook"}, {"url", `"` + hook(http.StatusUnauthorized, "/in") + `"`}, {"secrets", whsec}, {"allow_loopback", "true"}}, true},
		{"webhook refusing: 500", section{{"type", "webhook"}, {"url", `"` + hook(http.StatusInternalServerError, "/in") + `"`}, {"secrets", whsec}, {"allow_loopback", "true"}}, true},
		{"webhook refusing: 400, parks", section{{"type", "webhook"}, {"url", `"` + hook(http.StatusBadRequest, "/in") + `"`}, {"secrets", whsec}, {"allow_loopback", "true"}}, true},
		{"webhook refusing: 200 rejecting each record", section{{"type", "webhook"}, {"url", `"` + hook(http.StatusOK, "/in") + `"`}, {"secrets", whsec}, {"allow_loopback", "true"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &syncWriter{}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg, err := parseSection(tc.sec)
			if err != nil {
				t.Fatalf("the section does not parse: %v", err)
			}
			sk := cfg.Feeds[0].Sinks[0]
			b, err := builders[sk.Type](t.Context(), sk, feed.SinkID{Feed: "orders", Sink: "s"}, log)
			if !tc.applies {
				if err == nil {
					b.close()
					t.Fatal("built; want an error")
				}
				t.Log(err)
				if !strings.HasPrefix(err.Error(), "feeds.orders.sinks.s") {
					t.Errorf("err = %q does not name the sink's section", err)
				}
				wantNoSecret(t, "the error", err.Error(), secret)
				wantNoSecret(t, "the log", logs.String(), secret)
				return
			}
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			defer b.close()
			rejs, err := b.sink.Apply(t.Context(), []feed.Record{{Key: "k", Seq: 1, Doc: json.RawMessage(`{"a":1}`)}})
			if err == nil && len(rejs) == 0 {
				t.Fatal("the refusing receiver took the record")
			}
			if err != nil {
				wantNoSecret(t, "Apply's error", err.Error(), secret)
			}
			for _, r := range rejs {
				wantNoSecret(t, "a park reason", r.Reason, secret)
				wantNoSecret(t, "a park reason, cleaned", feed.CleanReason(r.Reason), secret)
			}
			wantNoSecret(t, "the log", logs.String(), secret)
		})
	}
}
