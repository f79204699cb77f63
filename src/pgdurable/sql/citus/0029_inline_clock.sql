-- The Citus layout, version 29 (recorded in schema_migrations as 10029): durable time stays a call here.
--
-- The single-node migration of this number makes clock_now() a SQL function that PostgreSQL inlines. Inlined,
-- its CASE of STABLE functions lands inside the layout's distributed statements, which Citus refuses ("non-
-- IMMUTABLE functions are not allowed in CASE or COALESCE statements"); called, the function is evaluated once,
-- on the coordinator. So the layout keeps the PL/pgSQL function (same result; the test clock's table is read
-- through test_clock_now(), as on a single node).
CREATE OR REPLACE FUNCTION clock_now() RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fake text := pg_catalog.current_setting('pgdurable.fake_now', true);
BEGIN
    IF fake <> '' THEN
        RETURN fake::pg_catalog.timestamptz;
    END IF;
    IF pg_catalog.current_setting('pgdurable.test_clock', true) = 'on' THEN
        RETURN test_clock_now();
    END IF;
    RETURN pg_catalog.now();
END;
$$;
