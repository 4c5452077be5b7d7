-- The concurrent write mode (see the package doc, "Commit order"): a feed
-- may be written without the feed lock, each writer leaving its key's row
-- unsealed, and a sealer gives the unsealed rows their seqs in rounds.
--
-- Additive: a feed keeps the locked mode it had (the column's default), and
-- a build before this step never sees an unsealed row as long as no feed is
-- switched to the concurrent mode; switch one only once every process runs
-- a build that knows the mode (SetWriteMode's doc says why).

ALTER TABLE {{table "generations"}}
    ADD COLUMN IF NOT EXISTS write_mode text NOT NULL DEFAULT 'locked'
        CHECK (write_mode IN ('locked', 'concurrent'));

-- A key written for the first time in the concurrent mode has no seq until
-- it is sealed. NULLs are distinct, so UNIQUE (feed, seq) stands, and a
-- reader's `seq > $after ORDER BY seq` never meets such a row.
ALTER TABLE {{table "rows"}} ALTER COLUMN seq DROP NOT NULL;

-- The unsealed write beside the sealed seq and doc, which stay readable
-- until the sealer replaces them: pending says one waits, pending_doc is its
-- document (NULL: a delete).
ALTER TABLE {{table "rows"}}
    ADD COLUMN IF NOT EXISTS pending boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS pending_doc jsonb;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_constraint
        WHERE conrelid = '{{table "rows"}}'::regclass AND conname = 'pending_doc_only_when_pending'
    ) THEN
        ALTER TABLE {{table "rows"}} ADD CONSTRAINT pending_doc_only_when_pending CHECK (pending OR pending_doc IS NULL);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_constraint
        WHERE conrelid = '{{table "rows"}}'::regclass AND conname = 'unsealed_only_when_pending'
    ) THEN
        ALTER TABLE {{table "rows"}} ADD CONSTRAINT unsealed_only_when_pending CHECK (seq IS NOT NULL OR pending);
    END IF;
END
$$;

-- The sealer's probe and its rounds read only the unsealed rows, however
-- large the feed.
CREATE INDEX IF NOT EXISTS {{index "rows_pending"}} ON {{table "rows"}} (feed, key) WHERE pending;

-- The sealer's lease, one row per feed, apart from the sinks' cursors so
-- that describe, collection and the sinks never count it.
CREATE TABLE IF NOT EXISTS {{table "sealers"}} (
    feed             text COLLATE "C" PRIMARY KEY,
    lease_holder     text,
    lease_expires_at timestamptz,
    CHECK ((lease_holder IS NULL) = (lease_expires_at IS NULL))
);
