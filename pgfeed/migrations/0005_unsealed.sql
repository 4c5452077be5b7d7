-- The concurrent mode's unsealed writes move out of the rows table into a
-- narrow table of their own (see the package doc, "Commit order"). Before,
-- a writer upserted its key's row with pending and pending_doc set, and the
-- seal rewrote that row: every write left two versions of a wide row, each
-- with new entries in every index (pending is in the partial index, so
-- neither update could be HOT). Now a writer upserts (feed, key, doc) into
-- unsealed, one tuple and one index entry like the application's own row,
-- and a round deletes what it seals from there and upserts the row once, at
-- its seq: the rows table is written only by sealing, once per sealed write.
--
-- A build from before this step would still write unsealed rows into the
-- rows table, where no sealer of this build looks: the CHECK below makes
-- such a write fail instead of waiting unsealed for good. Stop the older
-- processes that write to a concurrent-mode feed, migrate, then start the
-- new build (a feed in the locked mode is untouched by this step).

CREATE TABLE IF NOT EXISTS {{table "unsealed"}} (
    feed text COLLATE "C" NOT NULL,
    key  text COLLATE "C" NOT NULL,
    -- The write's document; NULL is a delete.
    doc  jsonb,
    PRIMARY KEY (feed, key)
);

-- Writers of the old layout wait for this step's end, and then fail.
LOCK TABLE {{table "rows"}} IN SHARE ROW EXCLUSIVE MODE;

-- What waits unsealed moves over; a key that was never sealed leaves the
-- rows table, since a row there is now always sealed.
INSERT INTO {{table "unsealed"}} AS u (feed, key, doc)
SELECT r.feed, r.key, r.pending_doc FROM {{table "rows"}} AS r WHERE r.pending
ON CONFLICT (feed, key) DO NOTHING;
DELETE FROM {{table "rows"}} WHERE pending AND seq IS NULL;
UPDATE {{table "rows"}} SET pending = false, pending_doc = NULL WHERE pending;

-- The columns and the partial index stay, for the old build's statements
-- to keep their meaning (the index on pending rows stays empty, and costs
-- nothing), but no row of this table waits unsealed any more.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_constraint
        WHERE conrelid = '{{table "rows"}}'::regclass AND conname = 'unsealed_writes_live_apart'
    ) THEN
        ALTER TABLE {{table "rows"}} ADD CONSTRAINT unsealed_writes_live_apart CHECK (NOT pending);
    END IF;
END
$$;

-- write (migration 4) again, its concurrent branch upserting into
-- unsealed; everything else, the locked branch's tombstone stamp included,
-- is as before.
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
            {{unsealedUpsert "feed_name" "keys" "docs" "gen"}};
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
                INSERT INTO {{table "rows"}} AS r (feed, key, seq, doc, deleted_at)
                SELECT feed_name, c.key, g.head - cardinality(keys) + c.ord, c.doc, CASE WHEN c.doc IS NULL THEN now() END
                FROM g, unnest(keys, docs) WITH ORDINALITY AS c(key, doc, ord)
                ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc, deleted_at = excluded.deleted_at
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

-- reset (migration 3) again: it empties unsealed too.
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
    DELETE FROM {{table "unsealed"}} AS u WHERE u.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;
