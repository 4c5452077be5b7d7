-- The feed, its generations row (the feed lock), sink cursors with their
-- lease, and parked records. Every table is logged: the fencing state must
-- survive a crash of the server exactly as the feed rows do.

CREATE TABLE IF NOT EXISTS {{table "generations"}} (
    feed       text COLLATE "C" PRIMARY KEY,
    generation bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    head       bigint NOT NULL DEFAULT 0 CHECK (head >= 0),
    projection text,
    partition  text
);

CREATE TABLE IF NOT EXISTS {{table "rows"}} (
    feed text COLLATE "C" NOT NULL,
    key  text COLLATE "C" NOT NULL,
    seq  bigint NOT NULL CHECK (seq >= 1),
    doc  jsonb,
    PRIMARY KEY (feed, key),
    UNIQUE (feed, seq)
);

CREATE TABLE IF NOT EXISTS {{table "cursors"}} (
    feed             text COLLATE "C" NOT NULL,
    sink             text COLLATE "C" NOT NULL,
    generation       bigint CHECK (generation >= 1),
    seq              bigint CHECK (seq >= 0),
    lease_holder     text,
    lease_expires_at timestamptz,
    last_advance_at  timestamptz,
    PRIMARY KEY (feed, sink),
    CHECK ((generation IS NULL) = (seq IS NULL)),
    CHECK (lease_holder IS NOT NULL OR lease_expires_at IS NULL)
);

CREATE TABLE IF NOT EXISTS {{table "parked"}} (
    feed      text COLLATE "C" NOT NULL,
    sink      text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    seq       bigint NOT NULL CHECK (seq >= 1),
    reason    text NOT NULL,
    parked_at timestamptz NOT NULL,
    PRIMARY KEY (feed, sink, key)
);

-- Collection and retry ask "is this key parked for any sink of the feed".
CREATE INDEX IF NOT EXISTS {{index "parked_key"}} ON {{table "parked"}} (feed, key);
