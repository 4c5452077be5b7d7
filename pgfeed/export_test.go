package pgfeed

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// SinkLockKey is the advisory lock key of id under s, for tests that hold the
// lock themselves.
func SinkLockKey(s *Store, id feed.SinkID) int64 { return s.sinkKey(id) }

// ClaimAdvisory runs the advisory lease's claim (statements.claimAdvisory) on
// conn, as the lease's own session does, and says whether it recorded holder.
func ClaimAdvisory(ctx context.Context, s *Store, conn *pgx.Conn, id feed.SinkID, holder feed.LeaseHolder) (bool, error) {
	tag, err := conn.Exec(ctx, s.sql.claimAdvisory, string(id.Feed), string(id.Sink), string(holder), s.now(), s.sinkKey(id))
	return tag.RowsAffected() > 0, err
}
