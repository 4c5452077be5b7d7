-- Checkpoints of projections, and the event log: a one-row head that hands out
-- global positions in commit order, one row per stream with its version, and
-- the events. Every table is logged: a checkpoint must survive a crash of the
-- server exactly as the view it was committed with does.

CREATE TABLE IF NOT EXISTS {{table "checkpoints"}} (
    projection text COLLATE "C" NOT NULL,
    partition  text COLLATE "C" NOT NULL DEFAULT '',
    position   bigint NOT NULL CHECK (position >= 1),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (projection, partition)
);

CREATE TABLE IF NOT EXISTS {{table "log"}} (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    head bigint NOT NULL DEFAULT 0 CHECK (head >= 0)
);
INSERT INTO {{table "log"}} (id, head) VALUES (true, 0) ON CONFLICT (id) DO NOTHING;

CREATE TABLE IF NOT EXISTS {{table "streams"}} (
    stream  text COLLATE "C" PRIMARY KEY,
    version bigint NOT NULL CHECK (version >= 1)
);

CREATE TABLE IF NOT EXISTS {{table "events"}} (
    position    bigint PRIMARY KEY CHECK (position >= 1),
    stream      text COLLATE "C" NOT NULL,
    version     bigint NOT NULL CHECK (version >= 1),
    type        text NOT NULL,
    data        jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream, version)
);
