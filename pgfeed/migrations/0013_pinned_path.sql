-- record, write and reset pin their own search_path. A capture trigger
-- runs as the role that ran Capture, and calls them with that role's
-- rights; until now it pinned search_path to pg_catalog, then pg_temp, for
-- its whole call, and they ran under it. Pinning the path costs every
-- call of a function that does it about 12,000 instructions (PostgreSQL
-- sets the setting, finds the schemas again on entry and after the
-- restore, and the caller's cached plans check the path), and a keyed
-- trigger is called once or twice for every single-row write. So a keyed
-- trigger now names every object of its own with its schema and runs
-- under the writer's path, and the functions it may call, whose bodies
-- name pg_catalog's functions and operators bare, pin the path
-- themselves: a writer that put a schema of its own ahead of pg_catalog,
-- or a type of its own in pg_temp, could otherwise have them resolve a
-- name to its own object and run it with the capture owner's rights.
-- Only the trigger's less common branches call them (the locked mode,
-- another isolation level, a key to check, TRUNCATE), and the backfill.
--
-- A later migration that replaces one of them with CREATE OR REPLACE
-- FUNCTION must say SET search_path again: a replacement without the
-- clause drops it.
ALTER FUNCTION {{table "record"}}(text, text[], bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{table "write"}}(text, text[], jsonb[], text, bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{table "reset"}}(text, text, bigint) SET search_path = pg_catalog, pg_temp;
