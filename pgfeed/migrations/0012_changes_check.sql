-- The changes table (migration 7) loses its CHECK (n > 0). PostgreSQL
-- reads a CHECK constraint's stored expression back from its text, and
-- prepares it, in every statement that inserts into the table, so the one
-- check cost each single-row write to a table captured by key about 14,000
-- instructions, some 7% of all the trigger added to it. It never had
-- anything to refuse: n is cardinality(keys), and the table's only writers,
-- record and the keyed capture trigger's own insert, insert a row only for
-- a statement with at least one key.
--
-- A check of n > 0 is dropped whatever its name (migration 7 let
-- PostgreSQL name it, and a long table prefix truncates such names); no
-- other check is touched.
DO $$
DECLARE
    c name;
BEGIN
    FOR c IN
        SELECT con.conname FROM pg_constraint AS con
        WHERE con.conrelid = '{{table "changes"}}'::regclass AND con.contype = 'c'
            AND pg_get_constraintdef(con.oid) = 'CHECK ((n > 0))'
    LOOP
        EXECUTE format('ALTER TABLE {{table "changes"}} DROP CONSTRAINT %I', c);
    END LOOP;
END
$$;
