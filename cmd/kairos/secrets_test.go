package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
// answer rejects the delivery's first record with such a reason; a 400 is
// only for deliveries with records, which then park.
func echoReceiver(t *testing.T, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		dec, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
		echo := fmt.Sprintf("you sent %s with %s, that is %s", r.URL.String(), auth, dec)
		var d struct {
			Records []struct {
				Key string `json:"key"`
			} `json:"records"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &d)
		// A 400 speaks of a delivery's records: one without records (a
		// resync's begin or publish) is taken, so the records park.
		if r.Method != http.MethodPost || status != http.StatusOK && (status != http.StatusBadRequest || len(d.Records) > 0) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, echo)
			return
		}
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

// privateRedis starts a Redis of the test's own on a spare port that wants
// password, stopped at cleanup; the shared one has no password to plant.
func privateRedis(t *testing.T, password string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		pgtest.Unavailable(t, "redis-server", err)
	}
	addr := pgtest.ClosedPort(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--requirepass", password, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if i == 100 {
			t.Fatalf("the private Redis on %s did not start: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSecretsNeverEchoedByTheDaemon runs the daemon with a password or token
// in every DSN and URL it takes, each sink working (the database and the
// pgtable target take any password over trust; NATS without accounts takes
// any user; Redis and the Kafka cluster want exactly the planted ones) or
// reachable and refusing (webhook receivers that answer 400, 500 and
// rejections, each echoing the request's URL and Authorization header), the
// database's password coming from the environment through ${VAR}. Nothing
// the daemon shows holds the secret: its log, /healthz, /readyz, /metrics,
// /v1/feeds, describe's output and the park reasons that parked list shows.
func TestSecretsNeverEchoedByTheDaemon(t *testing.T) {
	const secret = "D43mon-s3cret-Zk7"
	t.Setenv("KAIROS_TEST_PLANTED_PASSWORD", secret)
	srv := servers(t)
	schema, target := pgtest.Schema(t), pgtest.Schema(t)
	pgURL, err := url.Parse(srv.pg)
	if err != nil {
		t.Fatal(err)
	}
	withPassword := func(u url.URL, user, pw string) string {
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "kairos", secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	redisAddr := privateRedis(t, secret)
	bucket := fmt.Sprintf("kc_secrets_%d", time.Now().UnixNano())
	hook := func(status int) string {
		u, _ := url.Parse(echoReceiver(t, status).URL)
		u.User = url.UserPassword("app", secret)
		u.Path, u.RawQuery = "/in", "token="+secret
		return u.String()
	}
	const whsec = "[whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]"
	addr := pgtest.ClosedPort(t)
	dbURL := withPassword(*pgURL, pgURL.User.Username(), "${KAIROS_TEST_PLANTED_PASSWORD}")
	dbURL = strings.Replace(dbURL, "%7BKAIROS_TEST_PLANTED_PASSWORD%7D", "{KAIROS_TEST_PLANTED_PASSWORD}", 1)
	cfg := writeConfig(t, fmt.Sprintf(`database:
  url: "%s"
  schema: %s
http:
  listen: %s
log:
  level: debug
feeds:
  orders:
    poll_interval: 100ms
    sinks:
      parks:
        type: webhook
        url: "%s"
        secrets: %s
        allow_loopback: true
      rejects:
        type: webhook
        url: "%s"
        secrets: %s
        allow_loopback: true
      fails:
        type: webhook
        url: "%s"
        secrets: %s
        allow_loopback: true
      table:
        type: pgtable
        url: "%s"
        schema: %s
        table: orders
        create: true
      bus:
        type: nats
        url: "%s"
        bucket: %s
        memory_storage: true
      cache:
        type: redis
        url: "redis://:%s@%s/0"
        prefix: "ksecrets:"
      log:
        type: kafka
        brokers: [%s]
        create: true
        sasl: {mechanism: plain, user: kairos, password: "%s"}
`, dbURL, schema, addr,
		hook(http.StatusBadRequest), whsec, hook(http.StatusOK), whsec, hook(http.StatusInternalServerError), whsec,
		withPassword(*pgURL, pgURL.User.Username(), secret), target,
		strings.Replace(srv.nats, "nats://", "nats://app:"+secret+"@", 1), bucket,
		secret, redisAddr,
		cluster.ListenAddrs()[0], secret))
	t.Cleanup(func() {
		nc, err := nats.Connect(srv.nats)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		for name := range js.KeyValueStoreNames(context.Background()).Name() {
			if strings.HasPrefix(name, bucket) {
				_ = js.DeleteKeyValue(context.Background(), name)
			}
		}
	})
	said := map[string]string{} // everything the daemon and the verbs showed, by where
	code, out, stderr := kairos(t, "migrate", "-c", cfg)
	if code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	said["migrate"] = out + stderr
	pool := pgtest.Pool(t, srv.pg, pgx.QueryExecModeCacheStatement)
	if _, err := pool.Exec(t.Context(), `CREATE SCHEMA "`+target+`"`); err != nil {
		t.Fatal(err)
	}
	_, st := migratedOn(t, schema)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(ctx, []string{"run", "-c", cfg}, io.Discard, logs) }()
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put("a", json.RawMessage(`{"a":1}`)), feed.Put("b", json.RawMessage(`{"b":2}`))}); err != nil {
		t.Fatal(err)
	}
	// Wait until both refusing receivers have parked, the working sinks
	// have caught up, and the failing one has failed.
	deadline := time.Now().Add(60 * time.Second)
	for {
		d, err := st.Describe(ctx, "orders")
		parked, caught := 0, 0
		for _, s := range d.Sinks {
			if s.Sink == "parks" || s.Sink == "rejects" {
				parked += len(s.Parked)
			}
			if s.Cursor.Seq == 2 && s.Sink != "fails" {
				caught++
			}
		}
		_, ready := get(t, "http://"+addr+"/readyz")
		if err == nil && parked >= 3 && caught == 6 && strings.Contains(ready, `"sink":"fails","phase":"`) && strings.Contains(ready, `"failing":true`) {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("the daemon stopped with exit %d:\n%s", code, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("after 60s: %+v, %v, /readyz %s; log:\n%s", d, err, ready, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/feeds", "/v1/feeds/orders", "/v1/feeds/nosuch"} {
		_, body := get(t, "http://"+addr+path)
		said[path] = body
		if path == "/metrics" && !strings.Contains(body, `sink="fails"`) {
			t.Errorf("/metrics has no series of the failing sink:\n%s", grepLines(body, "kairos_"))
		}
	}
	for _, args := range [][]string{
		{"describe", "-c", cfg}, {"describe", "-c", cfg, "-o", "json"},
		{"parked", "list", "orders", "parks", "-c", cfg, "-o", "json"}, {"parked", "list", "orders", "rejects", "-c", cfg},
		{"trace", "orders", "a", "-c", cfg}, {"config", "check", "-c", cfg},
	} {
		_, out, stderr := kairos(t, args...)
		said["kairos "+strings.Join(args, " ")] = out + stderr
	}
	for _, sink := range []feed.SinkName{"parks", "rejects"} {
		recs, err := st.ReadParked(ctx, feed.SinkID{Feed: "orders", Sink: sink})
		if err != nil || len(recs) == 0 {
			t.Fatalf("parked for %s: %v, %v", sink, recs, err)
		}
		for _, r := range recs {
			said["the park reason of "+string(sink)+"/"+string(r.Key)] = r.Reason
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not stop within 20s")
	}
	said["the daemon's log"] = logs.String()
	if !strings.Contains(logs.String(), "fails") || !strings.Contains(said["the park reason of rejects/a"], "you sent") {
		t.Fatalf("the failing sink was never logged, or no echo was ever shown; the test saw nothing to redact:\n%s", logs.String())
	}
	for where, s := range said {
		wantNoSecret(t, where, s, secret)
	}
}
