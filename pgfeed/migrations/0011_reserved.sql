-- An in-place backfill may copy its table from several connections at
-- once. Each connection's batch is written at seqs handed out to it before
-- it reads (a reservation), so the batches, and the writers of the feed
-- between them, commit their seqs out of order. Readers must then stop
-- below the first seq a batch still holds: reserved lists the seqs handed
-- out to a batch that has not committed, with the batch's transaction, and
-- a reader's snapshot tells whether that transaction had ended when the
-- read began. A batch deletes its own entry in the transaction that writes
-- its rows, so the rows and the end of the reservation become visible
-- together; the entry of a batch that rolled back names a transaction that
-- ended, which no reader waits for, and the next backfill of the feed
-- deletes it.
CREATE TABLE IF NOT EXISTS {{table "reserved"}} (
    feed      text COLLATE "C" NOT NULL,
    first_seq bigint NOT NULL,
    last_seq  bigint NOT NULL CHECK (last_seq >= first_seq),
    xid       xid8 NOT NULL,
    PRIMARY KEY (feed, first_seq)
);

-- backfill_shares splits an in-place backfill's table into ranges of its
-- key, one a connection copies, each with its own position, so that a run
-- that stopped resumes every range where its last committed batch left it.
-- first is the range's first key (NULL: the table's start), upto the next
-- range's first (NULL: the table's end), both the key's columns as text in
-- key order, as position is. The backfills row keeps the run's version and
-- its start and end; while the run is under way its rows and updated_at are
-- the shares' (each connection writes only its own share's row, so that
-- none waits for another's commit), and the run's end sums them there.
CREATE TABLE IF NOT EXISTS {{table "backfill_shares"}} (
    feed        text COLLATE "C" NOT NULL,
    share       int NOT NULL CHECK (share >= 0),
    first       text[],
    upto        text[],
    position    text[],
    rows        bigint NOT NULL DEFAULT 0 CHECK (rows >= 0),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    PRIMARY KEY (feed, share)
);
