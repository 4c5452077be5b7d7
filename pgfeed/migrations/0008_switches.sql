-- A writer in the concurrent mode takes the feed's write lock shared and
-- then reads the feed's write mode. In READ COMMITTED its read takes a
-- snapshot of its own, after the lock, so a switch (which takes the lock
-- exclusive) has either committed and is seen, or waits for the writer.
-- In REPEATABLE READ or SERIALIZABLE every statement reads the snapshot
-- the transaction took at its first statement, which may come before the
-- lock: after a switch to the locked mode that committed in between, the
-- writer still read 'concurrent' and wrote unsealed rows, or recorded
-- keys, into a locked feed, where no sealer runs; the change stayed
-- unreadable until the feed went back to the concurrent mode.
--
-- Such a writer cannot read the mode as it is after its lock: every plain
-- read is of its snapshot. What it can learn is whether a switch committed
-- after its snapshot, and then fail, as PostgreSQL fails a transaction
-- that would update a row updated after its snapshot. This step gives
-- each feed a row that a switch rewrites and nothing else touches
-- (switches), and mode_seen, which such a writer runs once it holds the
-- lock: it tries to insert the feed's row, and ON CONFLICT DO NOTHING
-- raises a serialization failure (40001) in these isolation levels when
-- the row it conflicts with is newer than the snapshot, which mode_seen
-- turns into an error that says why. A row the snapshot sees as it is
-- writes and locks nothing. The generations row cannot serve: the sealer
-- rewrites it at every round, and a row lock on it is the multixact
-- contention the concurrent mode exists to avoid.
--
-- A READ COMMITTED writer skips the check (one test of the isolation
-- level). The locked mode's statements need none in any level: their
-- upsert locks the generations row, and PostgreSQL fails it with 40001
-- when the row changed after the snapshot, a switch included.
--
-- The reset function is redefined at the end: outside READ COMMITTED it
-- refuses a feed in the concurrent mode, whose writes committed between the
-- snapshot and its lock its deletes cannot see.
--
-- Rows are written by SetWriteMode, in the switch's transaction, when the
-- mode changes; below, for the feeds already in the concurrent mode; and by
-- mode_seen itself for a feed that has none (one a build before this step
-- switched). A switch made by such a build writes no row, so a writer of
-- this build cannot tell it happened: switch modes with this build.

CREATE TABLE IF NOT EXISTS {{table "switches"}} (
    feed        text COLLATE "C" PRIMARY KEY,
    -- When the last switch of the feed's write mode committed; nothing
    -- reads it, an operator may.
    switched_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

INSERT INTO {{table "switches"}} (feed)
SELECT g.feed FROM {{table "generations"}} AS g WHERE g.write_mode = 'concurrent'
ON CONFLICT (feed) DO NOTHING;

-- mode_seen fails the transaction, with SQLSTATE 40001, when the feed's
-- write mode was switched by a transaction that committed after this
-- one's snapshot; otherwise it returns true. It is for a writer in
-- REPEATABLE READ or SERIALIZABLE that holds the feed's write lock shared
-- (a later switch then waits for its commit); in READ COMMITTED the insert
-- reads the latest row, and it always returns true. It runs as its owner,
-- so a writer needs no right on the switches table; it can only add a
-- feed's row, which a switch would add anyway. The block's subtransaction
-- gets no transaction id unless it inserts, which happens only for a feed
-- that a build before this step switched to the concurrent mode after this
-- step ran: the first such writer adds the row, and another that tries at
-- once waits for its commit and then fails, once, as if the mode changed.
CREATE OR REPLACE FUNCTION {{table "mode_seen"}}(feed_name text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $kairos$
BEGIN
    INSERT INTO {{table "switches"}} AS s (feed) VALUES (feed_name) ON CONFLICT (feed) DO NOTHING;
    RETURN true;
EXCEPTION WHEN serialization_failure THEN
    RAISE EXCEPTION 'kairos: feed %: its write mode changed under this transaction''s snapshot', feed_name
        USING ERRCODE = '40001',
        DETAIL = format('The transaction runs in %s and took its snapshot before a switch of the feed''s write mode committed, so it read the mode the feed had before.', current_setting('transaction_isolation')),
        HINT = 'Run the transaction again.';
END
$kairos$;

-- write (migration 5) again, its concurrent branch checking, outside READ
-- COMMITTED, that the mode its upsert reads is the feed's (mode_seen);
-- everything else is as before.
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

-- write_result (migration 6) again, its concurrent branch checking as
-- write's does.
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
            {{lockedUpsertV1 "feed_name" "cardinality(keys)" "keys" "docs" "channel" "written_generation, written_head"}};
            IF written_head IS NOT NULL THEN
                RETURN;
            END IF;
            mode := 'concurrent';
        END IF;
    END LOOP;
    RAISE EXCEPTION 'kairos: feed %: the write mode changed while the write ran', feed_name USING ERRCODE = '40001';
END
$kairos$;

-- record (migration 7) again: when the mode it reads is the concurrent one,
-- it checks, as write's concurrent branch does, that the mode is the
-- feed's. (When it reads the locked mode, the caller writes through write,
-- whose locked upsert fails if the feed's row changed under the snapshot.)
CREATE OR REPLACE FUNCTION {{table "record"}}(feed_name text, keys text[], write_key bigint)
RETURNS boolean LANGUAGE plpgsql AS $kairos$
DECLARE
    bad text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(write_key);
    IF NOT EXISTS (SELECT FROM {{table "generations"}} AS g WHERE g.feed = feed_name AND g.write_mode = 'concurrent') THEN
        RETURN false;
    END IF;
    {{modeSeen "feed_name"}}
    IF coalesce(cardinality(keys), 0) = 0 THEN
        RETURN true;
    END IF;
    SELECT CASE WHEN u.k IS NULL THEN 'key is NULL' WHEN u.k = '' THEN 'key is empty'
                ELSE format('key %s... is %s bytes long, more than the 512 allowed', left(u.k, 40), octet_length(u.k)) END
    INTO bad
    FROM unnest(keys) AS u(k)
    WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 512
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'kairos: feed %: %', feed_name, bad USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{table "changes"}} (feed, n, keys) VALUES (feed_name, cardinality(keys), keys);
    RETURN true;
END
$kairos$;

-- reset (migration 7) again: outside READ COMMITTED, it refuses a feed in
-- the concurrent mode. Its deletes read the transaction's snapshot, which
-- may predate the write lock it takes, and an unsealed write or recorded
-- key that a writer committed in between is invisible to them: it would
-- outlive the reset and be sealed into the new generation. In the locked
-- mode every write moves the generations row, so such a write makes the
-- row lock below fail with 40001 instead; in the concurrent mode writers
-- touch no row a reset could lock. The mode read after that lock is the
-- feed's: the lock fails on a row newer than the snapshot.
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
    DELETE FROM {{table "rows"}} AS r WHERE r.feed = feed_name;
    DELETE FROM {{table "unsealed"}} AS u WHERE u.feed = feed_name;
    DELETE FROM {{table "changes"}} AS c WHERE c.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;
