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

-- write is Write's statement as a function over one change set: keys[i]
-- gets docs[i], a NULL document a tombstone. The keys must be distinct,
-- as Write's are once compacted: a capture's set is (a statement's rows are
-- distinct by their unique key, and an UPDATE's tombstones are only the keys
-- no new row has), and so is a backfill batch; a set with a repeated key
-- fails with the upsert's own error (SQLSTATE 21000), writing nothing. A
-- feed in the concurrent write mode is refused (SQLSTATE 0A000): the lock
-- and seqs below are the locked mode's, and Capture and SetWriteMode keep
-- captured feeds locked, so this is the backstop, read under the row lock. It
-- refuses what the feed refuses (a NULL or empty key, one over 512 bytes, a
-- JSON null document) with SQLSTATE 22023, then, in one statement as Write
-- does, takes the feed lock by adding the number of changes to the head,
-- upserts the rows at the seqs handed out, in the set's order, and
-- notifies channel. An empty set writes nothing and takes no lock. It
-- returns the head, NULL when it wrote nothing. A transaction that writes a
-- key again replaces its row: one row per key, at its last seq.
CREATE OR REPLACE FUNCTION {{table "write"}}(feed_name text, keys text[], docs jsonb[], channel text)
RETURNS bigint LANGUAGE plpgsql AS $kairos$
DECLARE
    h    bigint;
    bad  text;
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
    IF h IS NULL THEN
        RAISE EXCEPTION 'kairos: feed % is in the concurrent write mode; a capture and a backfill write feeds of the locked mode only', feed_name
            USING ERRCODE = '0A000';
    END IF;
    RETURN h;
END
$kairos$;

-- reset is ResetTx's two statements as a function: the feed lock and the
-- next generation, then the feed emptied and channel notified. A TRUNCATE of
-- a captured table and a backfill into a new generation call it.
CREATE OR REPLACE FUNCTION {{table "reset"}}(feed_name text, channel text)
RETURNS bigint LANGUAGE plpgsql AS $kairos$
DECLARE
    gen bigint;
BEGIN
    INSERT INTO {{table "generations"}} AS g (feed, generation) VALUES (feed_name, 2)
    ON CONFLICT (feed) DO UPDATE SET generation = g.generation + 1 WHERE g.write_mode = 'locked'
    RETURNING g.generation INTO gen;
    IF gen IS NULL THEN
        RAISE EXCEPTION 'kairos: feed % is in the concurrent write mode; a capture and a backfill reset feeds of the locked mode only', feed_name
            USING ERRCODE = '0A000';
    END IF;
    DELETE FROM {{table "rows"}} AS r WHERE r.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;
