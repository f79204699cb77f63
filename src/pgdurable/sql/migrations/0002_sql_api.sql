-- pgdurable schema, version 2: the SQL API any language can call, and least-privilege roles.
-- Runs with search_path set to "<schema>, pg_temp"; SET search_path FROM CURRENT pins that into every
-- function, so they resolve names in this schema whoever calls them (and never in pg_temp first).

-- Enqueue a workflow inside the caller's transaction: it exists if and only if that transaction commits,
-- and workers are woken (NOTIFY) at commit. A given workflow_id is an idempotency key: enqueuing it again
-- returns the same id. Arguments go by name in a JSON object: '{"order_id": 42}'.
CREATE FUNCTION enqueue_workflow(
    workflow_name  text,
    input          jsonb       DEFAULT '{}',
    queue          text        DEFAULT 'default',
    workflow_id    text        DEFAULT NULL,
    priority       integer     DEFAULT 0,
    start_at       timestamptz DEFAULT NULL,
    delay          interval    DEFAULT NULL,
    max_recoveries integer     DEFAULT 5
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    new_id text := coalesce(workflow_id, gen_random_uuid()::text);
    owner_name text;
BEGIN
    IF workflow_name IS NULL OR length(workflow_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_name must be 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF input IS NULL OR jsonb_typeof(input) <> 'object' THEN
        RAISE EXCEPTION 'enqueue_workflow: input must be a JSON object of arguments by name, not %',
                        coalesce(jsonb_typeof(input), 'NULL')
            USING ERRCODE = '22023', HINT = 'for example: ''{"order_id": 42}''::jsonb';
    END IF;
    IF octet_length(input::text) > 8388608 THEN
        RAISE EXCEPTION 'enqueue_workflow: input is % bytes of JSON; the limit is 8 MiB', octet_length(input::text)
            USING ERRCODE = '54000', HINT = 'store large payloads in a table and pass their key';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'enqueue_workflow: queue % is not a valid queue name', quote_nullable(queue)
            USING ERRCODE = '22023', HINT = '1 to 100 letters, digits, or _ . : -';
    END IF;
    IF length(new_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF start_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_workflow: give start_at or delay, not both' USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;

    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at)
    VALUES (new_id, workflow_name, queue, priority, input, max_recoveries,
            coalesce(start_at, now() + coalesce(delay, interval '0')))
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT e.name INTO owner_name FROM workflow_executions e WHERE e.id = new_id;
        IF owner_name IS DISTINCT FROM workflow_name THEN
            RAISE EXCEPTION 'enqueue_workflow: workflow id % already belongs to workflow %', new_id, owner_name
                USING ERRCODE = '23505';
        END IF;
    END IF;
    RETURN new_id;
END;
$$;

-- The status and result of one execution; no row if there is none with this id.
CREATE FUNCTION workflow_status(workflow_id text)
RETURNS TABLE (status text, output jsonb, error jsonb, attempt integer, created_at timestamptz,
               completed_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT e.status, e.output, e.error, e.attempt, e.created_at, e.completed_at
    FROM workflow_executions e WHERE e.id = workflow_id;
$$;

-- Cancel an enqueued or running execution; true if it was. A running one stops at its next step.
CREATE FUNCTION cancel_workflow(workflow_id text) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH cancelled AS (
        UPDATE workflow_executions e
        SET status = 'cancelled', owner_id = NULL, lease_expires = NULL, completed_at = now(), updated_at = now()
        WHERE e.id = workflow_id AND e.status IN ('enqueued', 'running')
        RETURNING 1
    )
    SELECT count(*) > 0 FROM cancelled;
$$;

-- A transactional step's checkpoint, written in the step's own transaction just before it commits: true
-- if written, false if the writer no longer owns the execution's current attempt (then the caller rolls
-- the whole transaction back). Runs with the caller's rights (the worker's role).
CREATE FUNCTION checkpoint_step(execution_id text, attempt integer, step_id integer, step_name text,
                                output jsonb, error jsonb, attempts integer, started_at timestamptz)
RETURNS boolean
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH owned AS (
        SELECT e.id FROM workflow_executions e
        WHERE e.id = checkpoint_step.execution_id AND e.attempt = checkpoint_step.attempt
          AND e.status = 'running' AND e.lease_expires > now()
        FOR SHARE
    ), written AS (
        INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                       recorded_by_attempt, started_at)
        SELECT owned.id, checkpoint_step.step_id, checkpoint_step.step_name, checkpoint_step.output,
               checkpoint_step.error, checkpoint_step.attempts, checkpoint_step.attempt,
               checkpoint_step.started_at
        FROM owned
        ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) > 0 FROM written;
$$;

-- Least privilege. The functions above are for the roles granted below, not for everybody.
REVOKE ALL ON FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer),
                       workflow_status(text), cancel_workflow(text),
                       checkpoint_step(text, integer, integer, text, jsonb, jsonb, integer, timestamptz)
    FROM PUBLIC;

-- An application role: may enqueue, read status and cancel through the functions; no access to the
-- tables themselves.
CREATE FUNCTION grant_application_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.enqueue_workflow(text, jsonb, text, text, integer, '
                   'timestamptz, interval, integer), %I.workflow_status(text), %I.cancel_workflow(text) TO %I',
                   schema_name, schema_name, schema_name, role_name);
END;
$$;

-- A worker role: runs workflows, so it reads and writes the engine's tables and calls its functions.
CREATE FUNCTION grant_worker_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO %I',
                   schema_name, role_name);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %I TO %I', schema_name, role_name);
END;
$$;

REVOKE ALL ON FUNCTION grant_application_role(name), grant_worker_role(name) FROM PUBLIC;
