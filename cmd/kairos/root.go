package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/internal/config"
)

// defaultConfig is the file read when neither --config nor KAIROS_CONFIG
// names one.
const defaultConfig = "kairos.yaml"

type cli struct {
	stdout, stderr io.Writer
	configPath     string
	configSet      bool
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	c := &cli{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "kairos",
		Short: "Mirror PostgreSQL read models into the systems that serve them",
		Long: `kairos syncs feeds kept in PostgreSQL to their sinks — tables, caches,
buses, search indexes, webhooks — and lets you see and repair where each one
stands.

Configuration comes from one YAML file (--config, or $KAIROS_CONFIG, or
./kairos.yaml). Strings in it may take ${NAME} from the environment, which is
how passwords stay out of the file.

Exit codes: 0 ok, 1 failure, 2 usage or configuration mistake, 3 refused
because another process holds a lease.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())}
	})
	root.PersistentFlags().StringVarP(&c.configPath, "config", "c", "", "configuration file (default $KAIROS_CONFIG, or ./"+defaultConfig+")")
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		c.configSet = cmd.Flags().Changed("config")
		if !c.configSet {
			if env := os.Getenv("KAIROS_CONFIG"); env != "" {
				c.configPath, c.configSet = env, true
			} else {
				c.configPath = defaultConfig
			}
		}
	}
	root.AddCommand(c.versionCmd(), c.configCmd(), c.migrateCmd(), c.describeCmd(), c.parkedCmd(), c.sinkCmd(), c.collectCmd(), c.traceCmd(), c.runCmd(), c.demoCmd(), c.captureCmd(), c.backfillCmd())
	return root
}

// noArgs refuses arguments as a usage mistake, naming the command's
// subcommands when there are some.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasSubCommands() {
		return usagef("%q is not a command of %s (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
	return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
}

// load reads and checks the configuration file. A file that was not named
// and is absent is reported as such, with where it was looked for.
func (c *cli) load() (*config.Config, error) {
	cfg, err := config.Load(c.configPath, config.ParseOptions{SinkTypes: sinkTypes()})
	if errors.Is(err, fs.ErrNotExist) {
		if c.configSet {
			return nil, usagef("configuration file %s does not exist", c.configPath)
		}
		return nil, usagef("no configuration file: %s does not exist (name one with --config or $KAIROS_CONFIG)", c.configPath)
	}
	return cfg, err
}

func (c *cli) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this build",
		Long: `version prints the module's version (a tag, or devel for a build from a
checkout), the commit it was built from, with +dirty when the tree had
changes, and the Go release.

The go command records the commit only when it finds a .git directory above
the module, and not with -buildvcs=false: a build in a git worktree (where
.git is a file) or from a source archive records none. Name it at link time
then:

  go build -ldflags "-X main.buildRevision=$(git rev-parse HEAD)" ./cmd/kairos`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(c.stdout, version())
			return nil
		},
	}
}

// buildRevision is the commit a build came from, when the build sets it
// (go build -ldflags "-X main.buildRevision=$(git rev-parse HEAD)"). The go
// command records the revision itself only when it finds a .git directory
// above the module and -buildvcs is not false: a build in a git worktree,
// where .git is a file, or from a source archive records none, and this is
// the way to name the commit then.
var buildRevision string

// version is the module's version and the commit it was built from, as far
// as the build recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	return versionOf(info, ok, buildRevision)
}

// versionOf formats what a build recorded: the module's version (a tag or
// a pseudo-version when installed with go install …@version, devel when
// built in a checkout), the commit (12 hex digits, +dirty when the tree
// had changes) and the Go release. A commit set at link time stands in for
// one the go command did not record.
func versionOf(info *debug.BuildInfo, ok bool, linked string) string {
	if !ok || info == nil {
		if linked != "" {
			return "kairos devel (" + short(linked) + ")"
		}
		return "kairos (no build information)"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		rev = linked
	}
	out := "kairos " + v
	switch {
	case rev != "":
		out += " (" + short(rev) + dirty + ")"
	case v == "devel":
		out += " (no commit recorded: see kairos version --help)"
	}
	return out + " " + info.GoVersion
}

func short(rev string) string { return rev[:min(12, len(rev))] }

func (c *cli) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the configuration file",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var offline bool
	var timeout time.Duration
	check := &cobra.Command{
		Use:   "check",
		Short: "Check the configuration file, then reach every target it names",
		Long: `check reads the configuration file and reports every mistake in it — an
unknown key (with the nearest known one), a value of the wrong kind, a bad
duration, an unknown sink type, a missing required key, a name used twice,
an environment variable that is not set — each with its path in the file and
its line (exit code 2), before it connects to anything.

Then it probes, at once and each within --timeout, the database and every
sink's target: it connects and asks one harmless question (the server's
version, a PING, a writable directory), and reports each under its path in
the file. A probe writes nothing and creates nothing: tables, buckets,
topics, files and indexes are made by kairos run. Exit code 1 when a target
cannot be reached. --offline stops after the file's checks.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.load()
			if err != nil {
				return err
			}
			sinks := 0
			for _, f := range cfg.Feeds {
				sinks += len(f.Sinks)
			}
			fmt.Fprintf(c.stdout, "%s: ok: %d %s, %d %s\n", c.configPath, len(cfg.Feeds), plural(len(cfg.Feeds), "feed", "feeds"), sinks, plural(sinks, "sink", "sinks"))
			if offline {
				return nil
			}
			if timeout <= 0 {
				return usagef("--timeout: is %v; want a positive duration", timeout)
			}
			failed := 0
			res := probeAll(cmd.Context(), cfg, timeout)
			for _, r := range res {
				if r.err != nil {
					failed++
					fmt.Fprintf(c.stdout, "%s: unreachable: %v\n", r.path, r.err)
				} else {
					fmt.Fprintf(c.stdout, "%s: reached: %s\n", r.path, r.said)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d %s could not be reached", failed, len(res), plural(len(res), "target", "targets"))
			}
			return nil
		},
	}
	check.Flags().BoolVar(&offline, "offline", false, "check the file only; connect to nothing")
	check.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long each target's probe may take")
	cmd.AddCommand(check)
	return cmd
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
