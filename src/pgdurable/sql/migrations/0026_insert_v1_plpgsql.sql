-- pgdurable schema, version 26: insert_executions_v1, the previous release's insert, in PL/pgSQL.
--
-- It only calls insert_executions_v2, but as a SQL function pinned to its schema it is never inlined, so
-- every statement that calls it parses and plans that call again. A table binding's trigger calls it for
-- each row its table writes (table_binding_fire), so a bulk write to a bound table paid it per row.
CREATE OR REPLACE FUNCTION insert_executions_v1(rows jsonb, common jsonb DEFAULT '{}',
                                                raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM insert_executions_v2(rows, common, raise_on_conflict);
END;
$$;
