-- write_result: a whole feed write as one statement that returns its
-- result, so Store.QueueWrite can put it on the caller's own pgx.Batch and
-- the write costs no round trip of its own (Write sends a batch of its own
-- for the concurrent mode, and one statement for the locked mode, each a
-- round trip of its own beside the application's).
--
-- It starts with the mode the calling store had cached (cached_mode) and,
-- like Write, follows the mode the feed's row records: each branch's
-- statement writes nothing when the row says the other mode, and the other
-- branch then runs, so a SetWriteMode between queueing and sending costs a
-- statement, never a row in the wrong mode.
--
-- The concurrent branch takes the feed's write lock shared in a statement of
-- its own before the upsert. The function is VOLATILE, so under READ
-- COMMITTED each of its statements takes a snapshot of its own: the upsert's
-- is taken after the lock was granted, as Write's second statement's is,
-- and so a reset or a mode switch it waited for is seen by it.
--
-- It returns the generation the write landed in, and, in the locked mode,
-- the new head (the write's seqs are head-cardinality+1 .. head); a NULL
-- head says the write is unsealed. The changes are checked by the caller
-- (feed.PrepareChanges) before they are queued, so this function does not
-- check them again; documents arrive as text, which survives every exec
-- mode, and are cast to jsonb by the upserts.
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
