package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // the driver sql.Open names
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/internal/config"
)

// A probe is config check's look at one target: can this process reach it,
// as the file says, right now. It writes nothing and creates nothing — not
// a table, a bucket, a topic, a file or an index — so that a check is safe
// against production; building the sink (kairos run) is what creates.
// What it says on success is one short fact about the target.
type probe func(ctx context.Context, s config.Sink) (string, error)

// probes has one probe per sink type; a type of sinkTypes without one is a
// programming error, caught by a test.
var probes = map[string]probe{
	"pgtable": func(ctx context.Context, s config.Sink) (string, error) {
		c := s.Options.(*pgtableConfig)
		v, err := probePostgres(ctx, c.URL)
		return v, redactErr(err, c.URL)
	},
	"mysql": func(ctx context.Context, s config.Sink) (string, error) {
		c := s.Options.(*mysqlConfig)
		db, err := sql.Open("mysql", c.DSN)
		if err != nil {
			return "", redactErr(err, c.DSN)
		}
		defer db.Close()
		var v string
		if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
			return "", redactErr(err, c.DSN)
		}
		return "server " + v, nil
	},
	"kafka": func(ctx context.Context, s config.Sink) (string, error) {
		c := s.Options.(*kafkaConfig)
		opts, err := kafkaClient(s, c)
		if err != nil {
			return "", err
		}
		cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(c.Brokers...))...)
		if err != nil {
			return "", redactSecret(err, c.SASL.Password)
		}
		defer cl.Close()
		if err := cl.Ping(ctx); err != nil {
			return "", redactSecret(err, c.SASL.Password)
		}
		return "a broker answered", nil
	},
	"nats": func(ctx context.Context, s config.Sink) (string, error) {
		c := s.Options.(*natsConfig)
		opts := []nats.Option{nats.NoReconnect()}
		if d, ok := ctx.Deadline(); ok {
			opts = append(opts, nats.Timeout(time.Until(d)))
		}
		if c.CredsFile != "" {
			if _, err := os.ReadFile(c.CredsFile); err != nil {
				return "", fmt.Errorf("creds_file: %w", err)
			}
			opts = append(opts, nats.UserCredentials(c.CredsFile))
		}
		nc, err := nats.Connect(c.URL, opts...)
		if err != nil {
			return "", redactErr(err, c.URL)
		}
		defer nc.Close()
		if err := nc.FlushWithContext(ctx); err != nil {
			return "", redactErr(err, c.URL)
		}
		return "server " + nc.ConnectedServerVersion(), nil
	},
	"redis": func(ctx context.Context, s config.Sink) (string, error) {
		c := s.Options.(*redisConfig)
		o, err := goredis.ParseURL(c.URL)
		if err != nil {
			return "", redactErr(err, c.URL)
		}
		o.MaxRetries, o.DialerRetries = -1, 1 // one answer, not the client's retries
		cl := goredis.NewClient(o)
		defer cl.Close()
		if err := cl.Ping(ctx).Err(); err != nil {
			return "", redactErr(err, c.URL)
		}
		return "PING answered", nil
	},
	"webhook": func(ctx context.Context, s config.Sink) (string, error) {
		// Only a connection: any request would be a delivery to the
		// receiver, and the sink's own checks (loopback, private
		// addresses) run when kairos run builds it.
		c := s.Options.(*webhookConfig)
		u, err := url.Parse(c.URL)
		if err != nil {
			return "", err
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
		if err != nil {
			return "", err
		}
		_ = conn.Close()
		return "a connection to " + net.JoinHostPort(u.Hostname(), port), nil
	},
	"file": func(_ context.Context, s config.Sink) (string, error) {
		return probeDir(filepath.Dir(s.Options.(*fileConfig).Path))
	},
	"bleve": func(_ context.Context, s config.Sink) (string, error) {
		dir := s.Options.(*bleveConfig).Dir
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return probeDir(filepath.Dir(dir)) // the sink creates dir itself
		}
		return probeDir(dir)
	},
}

// probePostgres connects to PostgreSQL at url and reads its version.
func probePostgres(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", err
	}
	return "PostgreSQL " + v, nil
}

// probeDir says whether dir is a directory this process may write in.
func probeDir(dir string) (string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if err := syscall.Access(dir, 2 /* W_OK */); err != nil {
		return "", fmt.Errorf("%s is not writable: %w", dir, err)
	}
	return dir + " is writable", nil
}

// probed is one target's outcome, under its path in the file.
type probed struct {
	path, said string
	err        error
}

// probeAll probes the database and every sink at once, each within
// timeout, and returns their outcomes in the file's order.
func probeAll(ctx context.Context, cfg *config.Config, timeout time.Duration) []probed {
	type job struct {
		path string
		run  func(context.Context) (string, error)
	}
	jobs := []job{{"database.url", func(ctx context.Context) (string, error) {
		v, err := probePostgres(ctx, cfg.Database.URL)
		return v, redactErr(err, cfg.Database.URL)
	}}}
	if lu := cfg.Database.ListenURL; lu != "" {
		jobs = append(jobs, job{"database.listen_url", func(ctx context.Context) (string, error) {
			v, err := probePostgres(ctx, lu)
			return v, redactErr(err, lu)
		}})
	}
	for _, f := range cfg.Feeds {
		for _, s := range f.Sinks {
			jobs = append(jobs, job{s.Path, func(ctx context.Context) (string, error) { return probes[s.Type](ctx, s) }})
		}
	}
	out := make([]probed, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			said, err := j.run(ctx)
			out[i] = probed{path: j.path, said: said, err: err}
		})
	}
	wg.Wait()
	return out
}
