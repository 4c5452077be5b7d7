package pgread_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

// Three runners of one projection on PostgreSQL, one stopped half-way and
// another started late, while events keep arriving: every event is applied
// exactly once. The apply counts applications per position in the view, and
// a losing batch's counts roll back with its checkpoint move.
func TestRunnersOnPostgres(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 60*time.Second)
	counts := `"` + e.schema + `"."applied"`
	_, err := e.pool.Exec(ctx, `CREATE TABLE `+counts+` (position bigint PRIMARY KEY, n int NOT NULL)`)
	mustf(t, err, "create")
	apply := func(ctx context.Context, tx pgx.Tx, events []read.Event) error {
		positions := make([]int64, len(events))
		for i, ev := range events {
			positions[i] = int64(ev.Position)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+counts+` (position, n) SELECT p, 1 FROM unnest($1::bigint[]) AS p
ON CONFLICT (position) DO UPDATE SET n = `+counts+`.n + 1`, positions)
		return err
	}
	start := func(runCtx context.Context, wg *sync.WaitGroup) {
		r, err := read.NewRunner(e.log, read.ProjectionStore[pgx.Tx](e.store), keyEU, apply, read.RunnerOptions{Batch: 4, Poll: 5 * time.Millisecond, Logger: quiet})
		mustf(t, err, "runner")
		wg.Go(func() { _ = r.Run(runCtx) })
	}
	var wg sync.WaitGroup
	stopAll, cancelAll := context.WithCancel(ctx)
	defer func() { cancelAll(); wg.Wait() }()
	stopFirst, cancelFirst := context.WithCancel(stopAll)
	defer cancelFirst()
	start(stopFirst, &wg)
	start(stopAll, &wg)
	for i := range 20 {
		if i == 10 {
			cancelFirst()
			start(stopAll, &wg)
		}
		_, err := e.log.AppendCommitted(ctx, fmt.Sprintf("s%d", i%3), pgread.AnyVersion, []pgread.EventData{ev("A", `{}`), ev("B", `{}`), ev("C", `{}`)})
		mustf(t, err, "append %d", i)
	}
	head, err := e.log.Head(ctx)
	mustf(t, err, "head")
	for checkpoint(t, e.store, keyEU).Position != head {
		if ctx.Err() != nil {
			t.Fatalf("runners never caught up with %d", head)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition
	}
	cancelAll()
	wg.Wait()
	var rows, over int
	mustf(t, e.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n <> 1) FROM `+counts).Scan(&rows, &over), "counts")
	if rows != 60 || over != 0 {
		t.Fatalf("%d positions applied, %d of them more than once; want 60 and 0", rows, over)
	}
}
