-- A feed's rows may be stored under a name of their own. A backfill into a
-- new generation fills the generation apart, under a fresh name, from
-- several connections at once, each committing its share while no reader
-- knows the name; the transaction that moves the generation then points
-- the feed at it (generations.store), and the rows stored under the old
-- name are deleted after, outside any lock. Until a feed's first such
-- backfill its store is NULL, which means its own name, so nothing stored
-- moves. Every function that writes a feed's rows finds them through the
-- store: write and write_result (their locked branch), and reset.

ALTER TABLE {{table "generations"}} ADD COLUMN IF NOT EXISTS store text COLLATE "C";

-- stores lists the names rows are stored under that no feed points at:
-- one a backfill is filling (state filling, until its generation moves or
-- it fails), or one a feed left (retired). Their rows are deleted in
-- batches, after which the entry goes; a filling store is deleted only by
-- a backfill of its feed, which holds the feed's backfill lock, so never
-- under a live one.
CREATE TABLE IF NOT EXISTS {{table "stores"}} (
    store text COLLATE "C" PRIMARY KEY,
    feed  text COLLATE "C" NOT NULL,
    state text NOT NULL CHECK (state IN ('filling', 'retired')),
    since timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS {{index "stores_feed"}} ON {{table "stores"}} (feed);

-- write (migration 8) again: its locked branch writes the rows under the
-- feed's store, which the generations row it locks names.
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
            {{modeSeen "feed_name"}}
            {{unsealedUpsert "feed_name" "keys" "docs" "gen"}};
            IF gen IS NOT NULL THEN
                RETURN NULL;
            END IF;
            mode := 'locked';
        ELSE
            WITH g AS (
                INSERT INTO {{table "generations"}} AS g (feed, head) VALUES (feed_name, cardinality(keys))
                ON CONFLICT (feed) DO UPDATE SET head = g.head + excluded.head WHERE g.write_mode = 'locked'
                RETURNING g.head, coalesce(g.store, g.feed) AS store
            ), w AS (
                INSERT INTO {{table "rows"}} AS r (feed, key, seq, doc, deleted_at)
                SELECT g.store, c.key, g.head - cardinality(keys) + c.ord, c.doc, CASE WHEN c.doc IS NULL THEN now() END
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

-- write_result (migration 8) again, over the locked upsert that writes the
-- feed's store.
CREATE OR REPLACE FUNCTION {{table "write_result"}}(
    feed_name text, keys text[], docs text[], channel text, write_key bigint, cached_mode text,
    OUT written_generation bigint, OUT written_head bigint)
LANGUAGE plpgsql VOLATILE AS $kairos$
DECLARE
    mode text := cached_mode;
BEGIN
    IF coalesce(cardinality(keys), 0) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(keys) <> coalesce(cardinality(docs), 0) THEN
        RAISE EXCEPTION 'kairos: feed %: % keys and % documents', feed_name, cardinality(keys), cardinality(docs)
            USING ERRCODE = '22023';
    END IF;
    FOR attempt IN 1..2 LOOP
        IF mode = 'concurrent' THEN
            PERFORM pg_advisory_xact_lock_shared(write_key);
            {{modeSeen "feed_name"}}
            {{unsealedUpsert "feed_name" "keys" "docs" "written_generation"}};
            IF written_generation IS NOT NULL THEN
                RETURN;
            END IF;
            mode := 'locked';
        ELSE
            {{lockedUpsert "feed_name" "cardinality(keys)" "keys" "docs" "channel" "written_generation, written_head"}};
            IF written_head IS NOT NULL THEN
                RETURN;
            END IF;
            mode := 'concurrent';
        END IF;
    END LOOP;
    RAISE EXCEPTION 'kairos: feed %: the write mode changed while the write ran', feed_name USING ERRCODE = '40001';
END
$kairos$;

-- reset (migration 8) again: it deletes the rows stored under the feed's
-- store, which it has locked.
CREATE OR REPLACE FUNCTION {{table "reset"}}(feed_name text, channel text, write_key bigint)
RETURNS bigint LANGUAGE plpgsql AS $kairos$
DECLARE
    gen bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(write_key);
    PERFORM 1 FROM {{table "generations"}} AS g WHERE g.feed = feed_name FOR UPDATE;
    IF {{snapshotTx}} AND EXISTS (SELECT FROM {{table "generations"}} AS g WHERE g.feed = feed_name AND g.write_mode = 'concurrent') THEN
        RAISE EXCEPTION 'kairos: feed %: a reset of a feed in the concurrent write mode needs READ COMMITTED; this transaction runs in %', feed_name, current_setting('transaction_isolation')
            USING ERRCODE = '25000',
            HINT = 'Run the transaction (the TRUNCATE of a captured table, say) in READ COMMITTED: in this level the reset reads the snapshot the transaction took before its lock, and would keep writes committed in between.';
    END IF;
    INSERT INTO {{table "generations"}} AS g (feed, generation) VALUES (feed_name, 2)
    ON CONFLICT (feed) DO UPDATE SET generation = g.generation + 1
    RETURNING g.generation INTO gen;
    DELETE FROM {{table "rows"}} AS r WHERE r.feed = {{storeOf "feed_name"}};
    DELETE FROM {{table "unsealed"}} AS u WHERE u.feed = feed_name;
    DELETE FROM {{table "changes"}} AS c WHERE c.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;
