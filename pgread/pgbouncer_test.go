package pgread_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

// Through PgBouncer in transaction mode, in the two exec modes a transaction
// pooler allows: migrations, binding, commits racing resets, and appends.
// Every statement of the package is a short one on the caller's connection,
// with no session state, so all of it must work there.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if url == "" {
		pgtest.Unavailable(t, "PgBouncer", errors.New("KAIROS_TEST_PGBOUNCER_URL is not set"))
	}
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"exec", pgx.QueryExecModeExec}, {"simple", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := setupURL(t, url, m.mode)
			raceCommitReset(t, e, 30)
			ctx := ctxFor(t, 30*time.Second)
			if _, err := e.log.AppendCommitted(ctx, "s", pgread.NoStream, []pgread.EventData{ev("A", `{}`), ev("B", `{}`)}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.log.AppendCommitted(ctx, "s", pgread.NoStream, []pgread.EventData{ev("A", `{}`)}); !errors.Is(err, pgread.ErrVersionConflict) {
				t.Fatalf("conflicting append: %v", err)
			}
			got, err := e.log.ReadAll(ctx, read.Origin, 10)
			if err != nil || len(got) != 2 || got[1].Type != "B" {
				t.Fatalf("ReadAll = %+v, %v", got, err)
			}
		})
	}
}
