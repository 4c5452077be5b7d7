-- Tombstone age: when each tombstone was made, so an operator can see that
-- collection is held back (a sink behind, a parked tombstone, a collection
-- that never runs) from the age of the oldest one, read by one index probe.
--
-- deleted_at is the time (now(), the transaction's start) of the
-- transaction that made the row the tombstone it is: a locked-mode write of
-- a delete, or, in the concurrent mode, the sealing round that sealed it,
-- since that is when the tombstone enters the feed and sinks can pass it.
-- A write or seal of a document clears it; a second delete of a key stamps
-- it again, as it writes a new tombstone at a new seq; a restamp of a parked
-- key (RetryParked) keeps it, as it only sends the same tombstone again. It
-- is the database's clock, whatever clock a store was given: it decides
-- nothing, it is only read. A build before this step neither stamps nor
-- clears it: a tombstone it writes has no stamp (not counted) or an older
-- one of the same key's, until this build writes the key again, and a
-- document it writes over a tombstone leaves the stamp on a row the index
-- leaves out (its doc is not NULL). So readers filter on doc, never on the
-- stamp alone.

ALTER TABLE {{table "rows"}} ADD COLUMN IF NOT EXISTS deleted_at timestamptz;

-- Tombstones already in the feed get the migration's time: their own is
-- unknown, so their age counts from now.
UPDATE {{table "rows"}} SET deleted_at = now()
WHERE doc IS NULL AND seq IS NOT NULL AND deleted_at IS NULL;

-- Only sealed tombstones have entries, so writing documents, and unsealed
-- rows of the concurrent mode, add nothing to it. Collection reads it too,
-- where the planner finds that cheaper than the seq range below the lowest
-- cursor: it then visits the feed's tombstones only.
CREATE INDEX IF NOT EXISTS {{index "rows_tombstones"}} ON {{table "rows"}} (feed, deleted_at)
    WHERE doc IS NULL AND seq IS NOT NULL;

-- The write function of migration 3 again, its locked statement stamping
-- deleted_at as Write's does; its concurrent statement leaves the stamp to
-- the seal. Everything else, and its comment there, is unchanged.
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
