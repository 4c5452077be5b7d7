-- A captured table's changes in the concurrent mode, recorded by key (see
-- the package doc, "Keyed capture"). A capture trigger whose document is
-- the row itself (no document expression) writes, in the concurrent mode,
-- one row here per statement: the keys the statement touched, nothing
-- more. The sealer reads each key's row from the table when it seals, in
-- the round's snapshot, and seals the key with that row's document, or a
-- tombstone when the table no longer has the row. The writer so pays for
-- its keys alone, not for a document and a feed row per key.
--
-- A row is visible to a round only once its writer committed, and then the
-- writer's changes to the table are visible to the same snapshot: the round
-- reads a state of the row at least as new as the write that recorded it.
-- Nothing locks these rows; a round deletes what it took, and rounds
-- serialise on the feed lock.

CREATE TABLE IF NOT EXISTS {{table "changes"}} (
    feed text COLLATE "C" NOT NULL,
    id   bigint GENERATED ALWAYS AS IDENTITY,
    -- n is cardinality(keys), so a round can budget its keys without
    -- reading the arrays of the rows it leaves.
    n    integer NOT NULL CHECK (n > 0),
    keys text[] COLLATE "C" NOT NULL,
    -- n is in the index, so a round picks its rows in id order from the
    -- index alone, an index scan that also marks the entries of rows
    -- earlier rounds deleted as dead and skips them from then on.
    PRIMARY KEY (feed, id) INCLUDE (n)
);

-- reset (migration 5) again: it empties the recorded changes too.
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
    DELETE FROM {{table "changes"}} AS c WHERE c.feed = feed_name;
    PERFORM pg_notify(channel, feed_name);
    RETURN gen;
END
$kairos$;

-- record is a keyed capture's write of one statement's keys (capture.go):
-- under the feed's write lock shared, as a concurrent writer takes it, and
-- only while the feed's row says the concurrent mode (read in a later
-- statement, so with a snapshot taken after the lock: a switch, which takes
-- the lock exclusive, cannot come between the read and the commit), it
-- refuses the keys the feed refuses (NULL, empty, over 512 bytes; SQLSTATE
-- 22023, as write does) and records them in one row. It returns whether it
-- did: false means the locked mode, where the caller writes the change set
-- with its documents through write instead. A key may repeat, within the
-- set or across rows: the sealer takes each key once per round.
CREATE OR REPLACE FUNCTION {{table "record"}}(feed_name text, keys text[], write_key bigint)
RETURNS boolean LANGUAGE plpgsql AS $kairos$
DECLARE
    bad text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(write_key);
    IF NOT EXISTS (SELECT FROM {{table "generations"}} AS g WHERE g.feed = feed_name AND g.write_mode = 'concurrent') THEN
        RETURN false;
    END IF;
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
