-- pgdurable schema, version 29: durable time inlined.
--
-- clock_now() becomes a SQL function with a standard body and no SET clause, which PostgreSQL inlines into
-- every statement that calls it. As PL/pgSQL with SET search_path, each call switched the search_path there
-- and back and set its expressions up again in every transaction: about 18 microseconds of server time on a
-- step checkpoint, whose statement reads durable time once (docs/benchmarks.md, "Durable time inlined"). A
-- standard body's names are bound when the function is created, so no caller's search_path can redirect them.
-- Same name, same result (fake_now, then the test clock, then now()): callers of every release keep their
-- meaning. The test clock's table is read by the new test_clock_now(), called only on a test schema.

CREATE FUNCTION test_clock_now() RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN pg_catalog.now() + (SELECT c.ahead FROM test_clock c);
END;
$$;
REVOKE ALL ON FUNCTION test_clock_now() FROM PUBLIC;

CREATE OR REPLACE FUNCTION clock_now() RETURNS timestamptz
LANGUAGE sql
STABLE
RETURN CASE
    WHEN pg_catalog.current_setting('pgdurable.fake_now', true) <> ''
        THEN pg_catalog.current_setting('pgdurable.fake_now', true)::pg_catalog.timestamptz
    WHEN pg_catalog.current_setting('pgdurable.test_clock', true) = 'on' THEN test_clock_now()
    ELSE pg_catalog.now()
END;
