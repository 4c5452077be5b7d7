package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"github.com/kairos-es/kairos/internal/pgtest"
)

// TestMain runs the tests, or, when a test started this binary again as a
// daemon (asDaemon set), the kairos command itself, so the subprocess tests
// run the real command without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv(asDaemon) == "1" {
		main()
		return
	}
	// bleve starts a pool of analysis workers when it loads, which live as
	// long as the process.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

// asDaemon, set in a subprocess's environment, makes the test binary the
// kairos command.
const asDaemon = "KAIROS_TEST_RUN_AS_COMMAND"

// kairos runs one command line and returns its exit code and output.
func kairos(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// syncWriter is a buffer safe for a daemon's goroutines to log into.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
func (w *syncWriter) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.b.String() }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kairos.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUsageMistakesExitTwo(t *testing.T) {
	g := golden(t, "usage")
	for _, args := range [][]string{{"bogus"}, {"--nope"}, {"version", "extra"}, {"config", "nope"}, {"migrate", "--print=maybe"}, {"run", "--config-poll", "-1s"}, {"run", "--config-poll", "soon"}, {"run", "--tombstone-poll", "0s"}} {
		code, _, stderr := g.run(args...)
		if code != exitUsage || !strings.HasPrefix(stderr, "kairos: ") {
			t.Errorf("kairos %v = exit %d, %q; want exit %d with a message", args, code, stderr, exitUsage)
		}
	}
	if code, out, _ := g.run("--help"); code != exitOK || !strings.Contains(out, "Exit codes") {
		t.Errorf("--help = exit %d, %q", code, out)
	}
	if code, out, _ := g.run("version"); code != exitOK || !strings.HasPrefix(out, "kairos ") {
		t.Errorf("version = exit %d, %q", code, out)
	}
}

func TestConfigCheck(t *testing.T) {
	g := golden(t, "config-check")
	good := writeConfig(t, `database:
  url: ${KAIROS_TEST_CHECK_URL}
feeds:
  orders:
    sinks:
      table:
        type: pgtable
        url: postgres://x@db/x
        table: orders
      hook:
        type: webhook
        url: https://example.com/hook
        secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]
        timeout: 5s
`)
	t.Setenv("KAIROS_TEST_CHECK_URL", "postgres://app:pw@db/app")
	g.subst = append(g.subst, good, "<good>")
	code, out, stderr := g.run("config", "check", "--offline", "-c", good)
	if code != exitOK || !strings.Contains(out, "ok: 1 feed, 2 sinks") {
		t.Fatalf("check of a good file = exit %d, %q, %q", code, out, stderr)
	}
	bad := writeConfig(t, `database:
  url: ${KAIROS_TEST_CHECK_URL}
  shema: x
feeds:
  orders:
    sinks:
      table:
        type: pgtabel
      hook:
        type: webhook
        url: https://example.com/hook
        timeout: soon
`)
	g.subst = append(g.subst, bad, "<bad>")
	code, _, stderr = g.run("config", "check", "--config", bad)
	if code != exitUsage {
		t.Fatalf("check of a bad file = exit %d, %q; want %d", code, stderr, exitUsage)
	}
	for _, want := range []string{
		"4 mistakes",
		bad + `:3:3: database.shema: is not a known key; did you mean "schema"?`,
		bad + `:8:15: feeds.orders.sinks.table.type: is not a sink type; did you mean "pgtable"?`,
		"feeds.orders.sinks.hook.secrets: is required",
		bad + ":12:18: feeds.orders.sinks.hook.timeout: is not a duration",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the check's report lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "pw@") {
		t.Errorf("the report repeats the database password:\n%s", stderr)
	}
	// Without a file: where it was looked for, and how to name one.
	t.Setenv("KAIROS_CONFIG", "")
	t.Chdir(t.TempDir())
	if code, _, stderr := g.run("config", "check"); code != exitUsage || !strings.Contains(stderr, "kairos.yaml does not exist") || !strings.Contains(stderr, "--config") {
		t.Errorf("check without a file = exit %d, %q", code, stderr)
	}
	if code, _, stderr := g.run("config", "check", "-c", "missing.yaml"); code != exitUsage || !strings.Contains(stderr, "missing.yaml does not exist") {
		t.Errorf("check of a missing named file = exit %d, %q", code, stderr)
	}
}

func TestMigrate(t *testing.T) {
	schema := pgtest.Schema(t)
	cfg := writeConfig(t, "database:\n  url: "+pgtest.URL()+"\n  schema: "+schema+"\n")
	g := golden(t, "migrate", cfg, "<config>", pgtest.URL(), "<database>")
	code, out, stderr := g.run("migrate", "--print", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "-- pgfeed") || !strings.Contains(out, "-- pgread") || !strings.Contains(out, `"`+schema+`"`) {
		t.Fatalf("migrate --print = exit %d, stderr %q, output of %d bytes", code, stderr, len(out))
	}
	conn, err := pgx.Connect(t.Context(), pgtest.URL())
	if err != nil {
		pgtest.Unavailable(t, "the test database", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("--print touched the database: %d schemas named %s, %v", n, schema, err)
	}
	code, out, stderr = g.run("migrate", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "pgfeed: applied 1") || !strings.Contains(out, "pgread: applied 1, 2") {
		t.Fatalf("migrate = exit %d, %q, %q", code, out, stderr)
	}
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&n); err != nil || n < 4 {
		t.Fatalf("after migrate the schema has %d tables, %v", n, err)
	}
	code, out, _ = g.run("migrate", "-c", cfg)
	if code != exitOK || out != "pgfeed: up to date\npgread: up to date\n" {
		t.Fatalf("a second migrate = exit %d, %q", code, out)
	}
}

// A database that cannot be reached fails with exit 1 and never repeats
// the connection string's password.
func TestMigrateUnreachableRedacts(t *testing.T) {
	const pw = "Sup3r-s3cret-pw"
	cfg := writeConfig(t, "database:\n  url: postgres://app:"+pw+"@"+pgtest.ClosedPort(t)+"/app?connect_timeout=2\n")
	code, _, stderr := kairos(t, "migrate", "-c", cfg)
	if code != exitFailure || stderr == "" {
		t.Fatalf("migrate to a closed port = exit %d, %q", code, stderr)
	}
	if strings.Contains(stderr, pw) {
		t.Fatalf("the error repeats the password: %s", stderr)
	}
	// A command that opens the feed store names the setting it could not
	// reach with, rather than the schema check that found out.
	code, _, stderr = kairos(t, "capture", "list", "-c", cfg)
	if code != exitFailure || !strings.HasPrefix(stderr, "kairos: database.url: ") || strings.Contains(stderr, pw) {
		t.Fatalf("capture list against a closed port = exit %d, %q; want %d naming database.url", code, stderr, exitFailure)
	}
	bad := writeConfig(t, "database:\n  url: \"postgres://app:"+pw+"@host:notaport/app\"\n")
	code, _, stderr = kairos(t, "migrate", "-c", bad)
	if code == exitOK || strings.Contains(stderr, pw) {
		t.Fatalf("migrate with an unparsable URL = exit %d, %q", code, stderr)
	}
}

// The README's example file checks, so the example a newcomer copies works.
func TestREADMEExampleChecks(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## The `kairos` command")
	_, block, ok2 := strings.Cut(after, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("the README has no example configuration under its kairos command section")
	}
	for _, v := range []string{"KAIROS_DB_PASSWORD", "REPLICA_URL", "WEBHOOK_SECRET"} {
		t.Setenv(v, "x")
	}
	t.Setenv("WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if code, out, stderr := kairos(t, "config", "check", "--offline", "-c", writeConfig(t, block)); code != exitOK {
		t.Fatalf("the README's example = exit %d, %q, %q", code, out, stderr)
	}
}

// examples/kairos.yaml, the commented reference, checks.
func TestExampleConfigChecks(t *testing.T) {
	t.Setenv("KAIROS_DB_PASSWORD", "x")
	t.Setenv("MYSQL_PASSWORD", "x")
	t.Setenv("KAFKA_PASSWORD", "x")
	t.Setenv("NATS_PASSWORD", "x")
	t.Setenv("REDIS_PASSWORD", "x")
	t.Setenv("PARTNER_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	code, out, stderr := kairos(t, "config", "check", "--offline", "-c", "../../examples/kairos.yaml")
	if code != exitOK || !strings.Contains(out, "ok: 1 feed, 8 sinks") {
		t.Fatalf("examples/kairos.yaml = exit %d, %q, %q", code, out, stderr)
	}
}

// version says what the build recorded, and a commit named at link time
// stands in for one the go command could not record.
func TestVersionOf(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	devel := func(settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/kairos-es/kairos", Version: "(devel)"}, Settings: settings}
	}
	for _, c := range []struct {
		name   string
		info   *debug.BuildInfo
		ok     bool
		linked string
		want   string
	}{
		{"go install at a tag", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}}, true, "", "kairos v0.3.0 go1.26.8"},
		{"go install at a commit", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261201104200-0123456789ab"}}, true, "", "kairos v0.0.0-20261201104200-0123456789ab go1.26.8"},
		{"a checkout", devel(debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), true, "", "kairos devel (0123456789ab) go1.26.8"},
		{"a checkout with changes", devel(debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), true, "", "kairos devel (0123456789ab+dirty) go1.26.8"},
		{"a worktree", devel(), true, "", "kairos devel (no commit recorded: see kairos version --help) go1.26.8"},
		{"a worktree, commit linked in", devel(), true, rev, "kairos devel (0123456789ab) go1.26.8"},
		{"recorded beats linked", devel(debug.BuildSetting{Key: "vcs.revision", Value: "fedcba9876543210"}), true, rev, "kairos devel (fedcba987654) go1.26.8"},
		{"no build information", nil, false, "", "kairos (no build information)"},
	} {
		if got := versionOf(c.info, c.ok, c.linked); got != c.want {
			t.Errorf("%s: version = %q, want %q", c.name, got, c.want)
		}
	}
}

// The README's command list names every verb the command has, so the
// reference cannot fall behind the command.
func TestREADMEListsEveryVerb(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## The `kairos` command")
	_, block, ok2 := strings.Cut(after, "```sh\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("the README has no command list under its kairos command section")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(block, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "kairos" {
			continue
		}
		var words []string
		for _, f := range fields[1:] {
			if strings.HasPrefix(f, "-") || strings.HasPrefix(f, "[") || strings.HasPrefix(f, "#") || strings.ToUpper(f) == f {
				break
			}
			words = append(words, f)
			listed[strings.Join(words, " ")] = true
		}
	}
	var walk func(cmd *cobra.Command, path string)
	n := 0
	walk = func(cmd *cobra.Command, path string) {
		for _, sub := range cmd.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			p := strings.TrimSpace(path + " " + sub.Name())
			if sub.HasSubCommands() {
				walk(sub, p)
				continue
			}
			n++
			if !listed[p] {
				t.Errorf("the README's command list lacks kairos %s", p)
			}
		}
	}
	walk(newRoot(io.Discard, io.Discard), "")
	if n < 10 {
		t.Fatalf("walked %d verbs; the command tree was not read", n)
	}
}
