-- pgdurable schema, version 31: most rules of a workflow_executions row as the types of its columns.
--
-- check_execution_row (migrations 25 and 30) ran as PL/pgSQL for every row inserted or updated: the call and
-- its expression, prepared again in each transaction, cost an enqueue about 30 us of the server's time (a
-- tenth of a one-row commit; docs/benchmarks.md, "The row rules as domains"). A rule that reads one column
-- is now a CHECK of a domain, that column's type: PostgreSQL keeps a domain's checks prepared in each session
-- and runs them only on the values a statement writes (a claim checks the lease it sets, not the keys it
-- leaves alone). Three rules stay CHECK constraints of the table, each a small expression with no call: the
-- one over several columns (an owner and a lease exactly while running), and those of id and status, which
-- functions return as text (RETURN QUERY takes no domain where its result says text). A broken rule is
-- reported as before: SQLSTATE 23514, with the same constraint name.
--
-- The table is not rewritten nor its rows checked again: the columns change to domains over their own types
-- before the domains get their checks (a change to a type with checks would rewrite the table), and the
-- checks are added NOT VALID, as are the table's: the rows stored were held to the same rules by the
-- constraint this replaces. (schema.sql declares them the same way, so that both describe one catalog.)
-- PostgreSQL builds the partial indexes over the changed columns again: those of unfinished work are small,
-- the tags index is as large as the tagged history (1.0 s for the whole migration over a million finished
-- executions, a fifth of them tagged, on the machine of docs/benchmarks.md).
-- A schema with the Citus layout keeps its twelve constraints (see the layout's version 25).
DO $do$
BEGIN
    IF to_regprocedure('citus_buckets()') IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE $ddl$
        CREATE DOMAIN execution_queue AS text;
        CREATE DOMAIN execution_timeout AS double precision;
        CREATE DOMAIN execution_available_at AS timestamptz;
        CREATE DOMAIN execution_deadline AS timestamptz;
        CREATE DOMAIN execution_debounce_deadline AS timestamptz;
        CREATE DOMAIN execution_concurrency_key AS text;
        CREATE DOMAIN execution_dedup_key AS text;
        CREATE DOMAIN execution_debounce_key AS text;
        CREATE DOMAIN execution_tags AS jsonb
    $ddl$;
    -- A column's type cannot change under a view that reads it: the view is made again, as it was.
    EXECUTE 'DROP VIEW unrunnable_executions';
    EXECUTE $ddl$
        ALTER TABLE workflow_executions
            ALTER COLUMN queue TYPE execution_queue,
            ALTER COLUMN timeout_seconds TYPE execution_timeout,
            ALTER COLUMN available_at TYPE execution_available_at,
            ALTER COLUMN deadline TYPE execution_deadline,
            ALTER COLUMN debounce_deadline TYPE execution_debounce_deadline,
            ALTER COLUMN concurrency_key TYPE execution_concurrency_key,
            ALTER COLUMN dedup_key TYPE execution_dedup_key,
            ALTER COLUMN debounce_key TYPE execution_debounce_key,
            ALTER COLUMN tags TYPE execution_tags,
            DROP CONSTRAINT workflow_executions_row_rules,
            ADD CONSTRAINT workflow_executions_id_check CHECK (length(id) BETWEEN 1 AND 200) NOT VALID,
            ADD CONSTRAINT workflow_executions_status_check
                CHECK (status IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled')) NOT VALID,
            ADD CONSTRAINT workflow_executions_check
                CHECK ((status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL)) NOT VALID
    $ddl$;
    -- As in a CHECK constraint, a NULL value passes.
    EXECUTE $ddl$
        ALTER DOMAIN execution_queue ADD CONSTRAINT workflow_executions_queue_check
            CHECK (VALUE ~ '^[A-Za-z0-9_.:-]{1,100}$') NOT VALID;
        ALTER DOMAIN execution_timeout ADD CONSTRAINT workflow_executions_timeout_seconds_range
            CHECK (VALUE > 0 AND VALUE <= 315360000) NOT VALID;
        ALTER DOMAIN execution_available_at ADD CONSTRAINT workflow_executions_available_at_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_deadline ADD CONSTRAINT workflow_executions_deadline_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_debounce_deadline ADD CONSTRAINT workflow_executions_debounce_deadline_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_concurrency_key ADD CONSTRAINT workflow_executions_concurrency_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_dedup_key ADD CONSTRAINT workflow_executions_dedup_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_debounce_key ADD CONSTRAINT workflow_executions_debounce_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_tags ADD CONSTRAINT workflow_executions_tags_object
            CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID
    $ddl$;
    EXECUTE $ddl$
        DROP FUNCTION check_execution_row(text, text, text, text, timestamptz, double precision, timestamptz,
                                          timestamptz, text, text, text, timestamptz, jsonb)
    $ddl$;
    EXECUTE $ddl$
        CREATE VIEW unrunnable_executions AS
        SELECT e.id, e.name, e.queue, e.created_at,
               CASE WHEN e.status = 'waiting'
                    THEN 'parked: ' || coalesce(e.parked_reason, 'its history does not replay on the code that claimed it')
                    WHEN NOT EXISTS (SELECT 1 FROM workers w
                                     WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds))
                    THEN 'no live worker serves queue ' || e.queue
                    WHEN NOT EXISTS (SELECT 1 FROM workers w
                                     WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                                       AND worker_alive(w.heartbeat_at, w.lease_seconds))
                    THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
                    ELSE 'no live worker runs application version ' || e.app_version || ' or adopts other versions'
               END AS reason
        FROM workflow_executions e
        WHERE (e.status = 'enqueued'
               AND NOT EXISTS (SELECT 1 FROM workers w
                               WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                                 AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version
                                      OR w.adopt_after_seconds IS NOT NULL)
                                 AND worker_alive(w.heartbeat_at, w.lease_seconds)))
           OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL)
    $ddl$;
END;
$do$;
