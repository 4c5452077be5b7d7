-- record (migrations 7 and 8) again, with the same answers in fewer
-- statements. A keyed capture's trigger calls it once for each statement
-- its table runs, so its cost is paid by every single-row write: it read
-- the feed's mode, then looked for a refused key, then inserted the keys,
-- three statements each planned and started by PL/pgSQL. Now the insert
-- reads the mode itself (it inserts nothing unless the feed is in the
-- concurrent mode, read after the lock as before), and the search for a
-- refused key runs only when a cheap test of the whole array says one may
-- be there: none is NULL, none is empty, and all of them together are no
-- longer than one key may be. A refusal raised after the insert undoes it
-- with the rest of the writer's statement. The answers, the errors and the
-- order of the lock and mode_seen are as before.
CREATE OR REPLACE FUNCTION {{table "record"}}(feed_name text, keys text[], write_key bigint)
RETURNS boolean LANGUAGE plpgsql AS $kairos$
DECLARE
    bad text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(write_key);
    IF coalesce(cardinality(keys), 0) = 0 THEN
        IF NOT EXISTS (SELECT FROM {{table "generations"}} AS g WHERE g.feed = feed_name AND g.write_mode = 'concurrent') THEN
            RETURN false;
        END IF;
        {{modeSeen "feed_name"}}
        RETURN true;
    END IF;
    INSERT INTO {{table "changes"}} (feed, n, keys)
    SELECT feed_name, cardinality(keys), keys FROM {{table "generations"}} AS g
    WHERE g.feed = feed_name AND g.write_mode = 'concurrent';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    {{modeSeen "feed_name"}}
    IF array_position(keys, NULL) IS NOT NULL OR array_position(keys, ''::text) IS NOT NULL
        OR octet_length(array_to_string(keys, '')) > 512 THEN
        SELECT CASE WHEN u.k IS NULL THEN 'key is NULL' WHEN u.k = '' THEN 'key is empty'
                    ELSE format('key %s... is %s bytes long, more than the 512 allowed', left(u.k, 40), octet_length(u.k)) END
        INTO bad
        FROM unnest(keys) AS u(k)
        WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 512
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'kairos: feed %: %', feed_name, bad USING ERRCODE = '22023';
        END IF;
    END IF;
    RETURN true;
END
$kairos$;
