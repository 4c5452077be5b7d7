package main

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
)

func (c *cli) migrateCmd() *cobra.Command {
	var print bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Bring the feed and read-side tables to this build's version",
		Long: `migrate applies pgfeed's and pgread's migrations to the database and schema
of the configuration file, each step once, under a lock, so two processes
running it at once are safe. Steps already applied are skipped; a schema newer
than this build is left as it is.

With --print it connects to nothing and prints the same steps as SQL, for a
migration tool of your own.

Stop every process of an older build before you migrate (see CHANGELOG.md).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.load()
			if err != nil {
				return err
			}
			fo := pgfeed.Options{Schema: cfg.Database.Schema, TablePrefix: cfg.Database.TablePrefix}
			ro := pgread.Options{Schema: cfg.Database.Schema}
			if print {
				fsql, err := pgfeed.MigrationSQL(fo)
				if err != nil {
					return usageError{err}
				}
				rsql, err := pgread.MigrationSQL(ro)
				if err != nil {
					return usageError{err}
				}
				fmt.Fprintf(c.stdout, "-- pgfeed\n%s\n-- pgread\n%s", strings.TrimRight(fsql, "\n")+"\n", rsql)
				return nil
			}
			pool, err := pgxpool.New(cmd.Context(), cfg.Database.URL)
			if err != nil {
				return fmt.Errorf("database.url: %w", redactErr(err, cfg.Database.URL))
			}
			defer pool.Close()
			fv, err := pgfeed.Migrate(cmd.Context(), pool, fo)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			rv, err := pgread.Migrate(cmd.Context(), pool, ro)
			if err != nil {
				return redactErr(err, cfg.Database.URL)
			}
			report := func(pkg string, vs []int) {
				if len(vs) == 0 {
					fmt.Fprintf(c.stdout, "%s: up to date\n", pkg)
					return
				}
				fmt.Fprintf(c.stdout, "%s: applied %s\n", pkg, joinInts(vs))
			}
			report("pgfeed", fv)
			report("pgread", rv)
			return nil
		},
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the migrations' SQL instead of applying them")
	return cmd
}

func joinInts(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
