-- Table capture (capture.go, backfill.go): the registry of captured tables,
-- the progress of backfills, and the two functions through which a capture
-- trigger and a backfill write the feed. The functions are the one place a
-- captured change set meets the feed's write rules, so another write mode is
-- plugged in here, not in every installed trigger.

CREATE TABLE IF NOT EXISTS {{table "captures"}} (
    feed         text COLLATE "C" PRIMARY KEY,
    table_schema text NOT NULL,
    table_name   text NOT NULL,
    -- spec is the CaptureSpec as given; version hashes the SQL it installed,
    -- so a Capture with the same outcome changes nothing and one with a new
    -- outcome replaces the trigger.
    spec         jsonb NOT NULL,
    version      text NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE IF NOT EXISTS {{table "backfills"}} (
    feed        text COLLATE "C" PRIMARY KEY,
    -- version is the capture version the backfill reads the table with; a
    -- backfill under another one starts over.
    version     text NOT NULL,
    -- position is the last copied row's key columns as text, in key order;
    -- NULL before the first batch.
    position    text[],
    rows        bigint NOT NULL DEFAULT 0 CHECK (rows >= 0),
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);

-- write is Write's statement as a function over one change set, in the
-- feed's write mode: keys[i] gets docs[i], a NULL document a tombstone.
-- write_key is the feed's write lock (the advisory key Write takes, computed
-- by the caller: a capture trigger has it as a literal, a backfill passes
-- it). The keys must be distinct, as Write's are once compacted: a
-- capture's set is (a statement's rows are distinct by their unique key,
-- and an UPDATE's tombstones are only the keys no new row has), and so is a
-- backfill batch; a set with a repeated key fails with the upsert's own
-- error (SQLSTATE 21000), writing nothing. It refuses what the feed refuses
-- (a NULL or empty key, one over 512 bytes, a JSON null document) with
-- SQLSTATE 22023. Then, in the mode the feed's row records:
--   locked: in one statement as Write does, it takes the feed lock by adding
--   the number of changes to the head, upserts the rows at the seqs handed
--   out, in the set's order, and notifies channel; it returns the head.
--   concurrent: it takes the write lock shared, then, in a later statement
--   (so with a snapshot taken after the lock was granted, as this function
--   is volatile), upserts the rows unsealed by Write's own statement text,
--   only while the row still says concurrent; no feed lock, no notify; it
--   returns NULL (the sealer hands out the seqs).
-- The mode is read first without a lock, then each statement checks it
-- under its own lock and writes nothing when a switch (which takes both
-- locks) changed it, and the other mode's statement runs; a second change
-- within one transaction is ruled out, as in Write. An empty set writes
-- nothing and takes no lock, and returns NULL. A transaction that writes a
-- key again replaces its row: one row per key, at its last seq.
DROP FUNCTION IF EXISTS {{table "write"}}(text, text[], jsonb[], text);
CREATE OR REPLACE FUNCTION {{table "write"}}(feed_name text, keys text[], docs jsonb[], channel text, write_key bigint)
RETURNS bigint LANGUAGE plpgsql AS $kairos$
DECLARE
    h    bigint;
    gen  bigint;
    bad  text;
    mode text;
BEGIN
    IF coalesce(cardinality(keys), 0) = 0 THEN
        RETURN NULL;
    END IF;
    IF cardinality(keys) <> coalesce(cardinality(docs), 0) THEN
        RAISE EXCEPTION 'kairos: feed %: % keys and % documents', feed_name, cardinality(keys), cardinality(docs)
            USING ERRCODE = '22023';
    END IF;
    SELECT CASE WHEN u.k IS NULL THEN 'key is NULL' WHEN u.k = '' THEN 'key is empty'
                WHEN octet_length(u.k) > 512 THEN format('key %s... is %s bytes long, more than the 512 allowed', left(u.k, 40), octet_length(u.k))
                ELSE format('key %s: its document is JSON null; a deletion is a NULL document', u.k) END
    INTO bad
    FROM unnest(keys, docs) AS u(k, d)
    WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 512 OR u.d = 'null'::jsonb
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'kairos: feed %: %', feed_name, bad USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(max(g.write_mode), 'locked') INTO mode FROM {{table "generations"}} AS g WHERE g.feed = feed_name;
    FOR attempt IN 1..2 LOOP
        IF mode = 'concurrent' THEN
            PERFORM pg_advisory_xact_lock_shared(write_key);
            {{concurrentUpsert "feed_name" "keys" "docs" "gen"}};
            IF gen IS NOT NULL THEN
                RETURN NULL;
            END IF;
            mode := 'locked';
        ELSE
            WITH g AS (
                INSERT INTO {{table "generations"}} AS g (feed, head) VALUES (feed_name, cardinality(keys))
                ON CONFLICT (feed) DO UPDATE SET head = g.head + excluded.head WHERE g.write_mode = 'locked'
                RETURNING g.head
            ), w AS (
                INSERT INTO {{table "rows"}} AS r (feed, key, seq, doc)
                SELECT feed_name, c.key, g.head - cardinality(keys) + c.ord, c.doc
                FROM g, unnest(keys, docs) WITH ORDINALITY AS c(key, doc, ord)
                ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc
            )
            SELECT g.head INTO h FROM g, LATERAL (SELECT pg_notify(channel, feed_name)) AS notified;
            IF h IS NOT NULL THEN
                RETURN h;
            END IF;
            mode := 'concurrent';
        END IF;
    END LOOP;
    RAISE EXCEPTION 'kairos: feed %: the write mode changed while the write ran', feed_name USING ERRCODE = '40001';
END
$kairos$;

-- reset is ResetTx's statements as a function, in either mode: the feed's
-- write lock (write_key, as write's) exclusive, then the generations row FOR
-- UPDATE, which together wait for every open writer of either mode and hold
-- back every new one; then, in later statements (so they see every writer
-- waited for), the next generation, the feed emptied, unsealed rows
-- included, and channel notified. A TRUNCATE of a captured table and a
-- backfill into a new generation call it.
DROP FUNCTION IF EXISTS {{table "reset"}}(text, text);
CREATE OR REPLACE FUNCTION {{table "reset"}}(feed_name text, channel text, write_key bigint)
RETURNS bigint LANGUAGE plpgsql AS $kairos$
DECLARE
    gen bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(write_key);
    PERFORM 1 FROM {{table "generations"}} AS g WHERE g.feed = feed_name FOR UPDATE;
    INSERT INTO {{table "generations"}} AS g (feed, generation) VALUES (feed_name, 2)
    ON CONFLICT (feed) DO UPDATE SET generation = g.generation + 1
    RETURNING g.generation INTO gen;
    DELETE FROM {{table "rows"}} AS r WHERE r.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;
