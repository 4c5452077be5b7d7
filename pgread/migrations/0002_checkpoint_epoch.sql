-- A checkpoint's epoch: how many times it was reset. A reset used to delete
-- the row, so the origin after a reset could not be told from the origin
-- before it, and a commit from the origin that waited for a reset landed
-- after it. A reset now keeps the row, at position 0 in the next epoch, and
-- a commit's guard compares the epoch as well as the position. Rows from
-- before this step are in epoch 0, where their commits expect them; a key
-- with no row is still the origin of epoch 0.
--
-- Upgrade every process before the first reset after this step: a process
-- of the version before reads a reset row as the origin and commits from it
-- with an insert, which the kept row refuses, batch after batch.
--
-- Every statement is idempotent: a column that exists is kept, and only a
-- check on position other than the one this step adds is dropped.

ALTER TABLE {{table "checkpoints"}}
    ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0);

-- Position 0 is now stored (the origin of an epoch after a reset). The check
-- 0001 declared (position >= 1) carries a name PostgreSQL chose from the
-- table's, which a long prefix truncates, so it is found by its column.
DO $$
DECLARE
    c name;
BEGIN
    FOR c IN
        SELECT con.conname FROM pg_constraint con
        JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = ANY (con.conkey)
        WHERE con.conrelid = '{{table "checkpoints"}}'::regclass AND con.contype = 'c'
          AND a.attname = 'position' AND con.conname <> 'position_not_negative'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '{{table "checkpoints"}}', c);
    END LOOP;
    IF NOT EXISTS (
        SELECT FROM pg_constraint
        WHERE conrelid = '{{table "checkpoints"}}'::regclass AND conname = 'position_not_negative'
    ) THEN
        ALTER TABLE {{table "checkpoints"}} ADD CONSTRAINT position_not_negative CHECK (position >= 0);
    END IF;
END
$$;
