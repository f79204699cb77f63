-- pgdurable schema, version 25: the rules of a workflow_executions row in one CHECK constraint.
--
-- PostgreSQL keeps a CHECK constraint as the text of its expression tree and reads it back, then prepares
-- it, for every statement that inserts or updates the table (not once per session). workflow_executions had
-- twelve (11.6 kB of such text): measured with pgbench at one client on a copy of the table, an insert took
-- 0.34 ms with them and 0.22 ms without, an update of one row 0.25 against 0.18 ms. Every enqueue, claim,
-- heartbeat and completion paid it. The same rules in one PL/pgSQL function called by one constraint: 0.29
-- and 0.21 ms. A broken rule raises SQLSTATE 23514 naming the constraint that held the rule before.
--
-- The constraint is validated here against every row already stored (they kept the same rules), which
-- holds the table for one scan of it.

-- The rules every row of workflow_executions keeps, checked by its one CHECK constraint. One function
-- rather than a constraint per rule: PostgreSQL reads a table's CHECK expressions back from their stored
-- text and prepares them for every statement that writes the table, and twelve of them cost each insert
-- about 0.1 ms and each claim or completion 60 us (pgbench); a call to this function, whose statements
-- PL/pgSQL plans once per session, costs a fraction of that. A broken rule is reported as before: SQLSTATE
-- 23514, with the name the rule's own constraint had.
CREATE FUNCTION check_execution_row(
    id text, queue text, status text, owner_id text, lease_expires timestamptz, timeout_seconds double precision,
    available_at timestamptz, deadline timestamptz, concurrency_key text, dedup_key text, debounce_key text,
    debounce_deadline timestamptz, tags jsonb
) RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    broken text;
BEGIN
    -- As in a CHECK constraint, a rule that is NULL (a NULL column) holds.
    broken := CASE
        WHEN NOT coalesce(length(id) BETWEEN 1 AND 200, true) THEN 'workflow_executions_id_check'
        WHEN NOT coalesce(queue ~ '^[A-Za-z0-9_.:-]{1,100}$', true) THEN 'workflow_executions_queue_check'
        WHEN NOT coalesce(status IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled'), true)
            THEN 'workflow_executions_status_check'
        WHEN NOT coalesce((status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL), true)
            THEN 'workflow_executions_check'
        -- Time limits: a timeout of at most 10 years; stored times a client can load (the years 1 to 9999,
        -- with a day of margin for time zones). One bad row must never break the claim of its whole queue.
        WHEN NOT coalesce(timeout_seconds > 0 AND timeout_seconds <= 315360000, true)
            THEN 'workflow_executions_timeout_seconds_range'
        WHEN NOT coalesce(available_at BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_available_at_range'
        WHEN NOT coalesce(deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_deadline_range'
        WHEN NOT coalesce(debounce_deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_debounce_deadline_range'
        WHEN NOT coalesce(length(concurrency_key) BETWEEN 1 AND 200, true)
            THEN 'workflow_executions_concurrency_key_check'
        WHEN NOT coalesce(length(dedup_key) BETWEEN 1 AND 200, true) THEN 'workflow_executions_dedup_key_check'
        WHEN NOT coalesce(length(debounce_key) BETWEEN 1 AND 200, true) THEN 'workflow_executions_debounce_key_check'
        WHEN NOT coalesce(jsonb_typeof(tags) = 'object', true) THEN 'workflow_executions_tags_object'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "workflow_executions" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'workflow_executions';
    END IF;
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION check_execution_row(text, text, text, text, timestamptz, double precision, timestamptz,
                                           timestamptz, text, text, text, timestamptz, jsonb) FROM PUBLIC;

-- A schema with the Citus layout (sql/citus/0018) keeps its twelve constraints: Citus sends an ALTER TABLE of
-- a distributed table to its shards, where this function does not exist (propagation is deferred during
-- migrations). Each statement goes through EXECUTE, so that no statement is sent as part of a longer text.
DO $do$
DECLARE
    rule text;
BEGIN
    IF to_regprocedure('citus_buckets()') IS NOT NULL THEN
        RETURN;
    END IF;
    FOREACH rule IN ARRAY ARRAY[
        'id_check', 'queue_check', 'status_check', 'check', 'timeout_seconds_range', 'available_at_range',
        'deadline_range', 'debounce_deadline_range', 'concurrency_key_check', 'dedup_key_check',
        'debounce_key_check', 'tags_object'
    ] LOOP
        EXECUTE format('ALTER TABLE workflow_executions DROP CONSTRAINT %I', 'workflow_executions_' || rule);
    END LOOP;
    EXECUTE $ddl$
        ALTER TABLE workflow_executions ADD CONSTRAINT workflow_executions_row_rules
            CHECK (check_execution_row(id, queue, status, owner_id, lease_expires, timeout_seconds, available_at,
                                       deadline, concurrency_key, dedup_key, debounce_key, debounce_deadline, tags))
    $ddl$;
END;
$do$;
