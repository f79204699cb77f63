-- pgdurable schema, version 10: one insert path, channel names defined once, an overridable clock.
--
-- 1. insert_executions_v1: every way of creating an execution (enqueue, enqueue_many, App.start, a child,
--    a fork, a schedule tick, the SQL function enqueue_workflow) inserts through this one function, so
--    the derived values (status and wait_reason from a delay, available_at, the deadline, the claim of an
--    execution started in-process) are decided in one place.
-- 2. notify_channel(kind): the NOTIFY channel names ("<schema>_<kind>"), used by every trigger; Python
--    names them in channels.py, and a test checks that both agree.
-- 3. clock_now(): the engine's time for timers, deadlines and schedules. It is now(), unless a test sets
--    pgdurable.fake_now (SET pgdurable.fake_now = '2030-01-01 00:00+00'), Absurd's fake_now.
--
-- Functions whose signature may change later carry a version in their name (rule in sql/schema.sql).

-- == 3. The clock ==
-- Pinned like every function, so not inlined: a call costs a few microseconds (the search_path switch),
-- and a statement that compares many rows with it reads it once (a MATERIALIZED CTE, a variable).
CREATE FUNCTION clock_now() RETURNS timestamptz
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce(nullif(pg_catalog.current_setting('pgdurable.fake_now', true), '')::pg_catalog.timestamptz,
                    pg_catalog.now())
$$;

-- == 2. Channels ==
CREATE FUNCTION notify_channel(kind text) RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF kind IS NULL OR kind NOT IN ('work', 'done', 'stop', 'event', 'schedules') THEN
        RAISE EXCEPTION 'notify_channel: unknown channel kind %', quote_nullable(kind) USING ERRCODE = '22023';
    END IF;
    RETURN current_schema() || '_' || kind;
END;
$$;

CREATE OR REPLACE FUNCTION notify_enqueued() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(notify_channel('work'), queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'enqueued') AS queues;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM pg_notify(notify_channel('work'), NEW.queue);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM pg_notify(notify_channel('done'), NEW.id);
        IF OLD.status = 'running' AND (NEW.status = 'cancelled' OR NEW.error ->> 'type' = 'pgdurable.WorkflowTimeout') THEN
            PERFORM pg_notify(notify_channel('stop'), NEW.id);
        END IF;
        IF NEW.parent_id IS NOT NULL AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled') THEN
            UPDATE workflow_executions p
            SET wakeups = p.wakeups + 1,
                status = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN 'enqueued'
                              ELSE p.status END,
                available_at = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN now()
                                    ELSE p.available_at END
            WHERE p.id = NEW.parent_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION notify_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(notify_channel('event'), NEW.execution_id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION notify_schedule_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(notify_channel('schedules'), '');
    RETURN NULL;
END;
$$;

-- == 1. The insert path ==
-- One execution to create, as insert_executions_v1 reads it from JSON (by field name; absent fields are
-- NULL, then the function's defaults apply).
CREATE TYPE execution_spec_v1 AS (
    id              text,
    name            text,
    input           jsonb,
    queue           text,
    priority        integer,
    max_recoveries  integer,
    -- When it may start: start_at, else delay_seconds from now (clock_now()), else now.
    start_at        timestamptz,
    delay_seconds   double precision,
    timeout_seconds double precision,
    -- Inherited from a parent (the earlier of it and the execution's own timeout applies).
    deadline        timestamptz,
    dedup_key       text,
    concurrency_key text,
    trace_context   jsonb,
    parent_id       text,
    forked_from     text,
    -- Given: the execution is created already claimed by this owner (App.start), attempt 1, with a lease
    -- of lease_seconds, and app_version stamped.
    owner_id        text,
    lease_seconds   double precision,
    app_version     text
);

-- Create executions: one per element of the JSON array rows (objects with the fields of
-- execution_spec_v1; a field an element leaves out is taken from the object common, so a bulk enqueue sends
-- the options shared by all its rows once). Rows are inserted in array order (their seq, the claim's
-- tiebreaker, follows it). An id or dedup key already taken is skipped (nothing returned for it), or, with
-- raise_on_conflict, raises unique_violation (23505). Returns the executions created.
--
-- Decided here, for every creator: a delayed start (delay_seconds > 0, or start_at after now) waits in
-- 'waiting' with wait_reason 'delay' until the timer enqueues it; otherwise it is 'enqueued' (or 'running',
-- owned, for an in-process start, whose deadline is then fixed from its timeout, clamped to 10 years).
-- Validation is the callers' (enqueue_workflow in SQL, limits.py in Python) and the table's constraints.
CREATE FUNCTION insert_executions_v1(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    -- Read once: clock_now() is a (pinned, so not inlined) function call.
    at timestamptz := clock_now();
    created integer;
BEGIN
    RETURN QUERY
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, deadline, dedup_key, concurrency_key,
                                          trace_context, parent_id, forked_from, owner_id, lease_expires, attempt,
                                          started_at, app_version, created_at, updated_at)
    SELECT s.id, s.name, coalesce(s.queue, 'default'), coalesce(s.priority, 0), coalesce(s.input, '{}'),
           coalesce(s.max_recoveries, 5), s.available_at,
           CASE WHEN s.owned THEN 'running' WHEN s.delayed THEN 'waiting' ELSE 'enqueued' END,
           CASE WHEN s.delayed THEN 'delay' END,
           s.timeout_seconds,
           CASE WHEN s.owned AND s.timeout_seconds IS NOT NULL
                THEN least(coalesce(s.deadline, 'infinity'),
                           at + make_interval(secs => least(s.timeout_seconds, 315360000)))
                ELSE s.deadline END,
           s.dedup_key, s.concurrency_key, nullif(s.trace_context, 'null'), s.parent_id, s.forked_from,
           s.owner_id,
           CASE WHEN s.owned THEN now() + make_interval(secs => s.lease_seconds) END,
           CASE WHEN s.owned THEN 1 ELSE 0 END,
           CASE WHEN s.owned THEN at END,
           s.app_version, at, at
    FROM (
        SELECT p.*, p.owner_id IS NOT NULL AS owned,
               coalesce(p.start_at, at + make_interval(secs => coalesce(p.delay_seconds, 0))) AS available_at,
               p.owner_id IS NULL AND (p.delay_seconds > 0 OR p.start_at > at) AS delayed
        FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v1, common), rows))
                 WITH ORDINALITY AS p
        ORDER BY p.ordinality
    ) AS s
    ON CONFLICT DO NOTHING
    RETURNING e.id, e.name, e.status, e.attempt, e.input;
    GET DIAGNOSTICS created = ROW_COUNT;
    IF raise_on_conflict AND created < jsonb_array_length(rows) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
            USING ERRCODE = '23505', DETAIL = 'insert_executions_v1: an id given is taken';
    END IF;
END;
$$;

-- Same signature and checks as version 8 (CREATE OR REPLACE keeps its grants); the insert goes through
-- insert_executions_v1.
CREATE OR REPLACE FUNCTION enqueue_workflow(
    workflow_name   text,
    input           jsonb       DEFAULT '{}',
    queue           text        DEFAULT 'default',
    workflow_id     text        DEFAULT NULL,
    priority        integer     DEFAULT 0,
    start_at        timestamptz DEFAULT NULL,
    delay           interval    DEFAULT NULL,
    max_recoveries  integer     DEFAULT 5,
    timeout_seconds double precision DEFAULT NULL,
    dedup_key       text        DEFAULT NULL,
    concurrency_key text        DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    new_id text := coalesce(workflow_id, gen_random_uuid()::text);
    owner_name text;
    duplicate_id text;
    ten_years constant interval := make_interval(secs => 315360000);
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
    IF starts_with(new_id, 'sched:') THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_id % begins with "sched:", which is reserved for schedule ticks',
                        quote_literal(new_id)
            USING ERRCODE = '22023';
    END IF;
    IF start_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_workflow: give start_at or delay, not both' USING ERRCODE = '22023';
    END IF;
    IF start_at IS NOT NULL AND NOT (start_at BETWEEN clock_now() - ten_years AND clock_now() + ten_years) THEN
        RAISE EXCEPTION 'enqueue_workflow: start_at % is not a finite time within 10 years of now', start_at
            USING ERRCODE = '22023';
    END IF;
    IF delay IS NOT NULL AND NOT (delay BETWEEN interval '0' AND ten_years) THEN
        RAISE EXCEPTION 'enqueue_workflow: delay % must be >= 0 and <= 10 years (315360000 seconds)', delay
            USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT (timeout_seconds > 0 AND timeout_seconds <= 315360000) THEN
        RAISE EXCEPTION 'enqueue_workflow: timeout_seconds % must be a finite number of seconds, > 0 and <= '
                        '315360000 (10 years)', timeout_seconds
            USING ERRCODE = '22023';
    END IF;
    IF length(dedup_key) NOT BETWEEN 1 AND 200 OR length(concurrency_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: dedup_key and concurrency_key must be 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;

    PERFORM FROM insert_executions_v1(jsonb_build_array(jsonb_build_object(
        'id', new_id, 'name', workflow_name, 'input', input, 'queue', queue, 'priority', priority,
        'max_recoveries', max_recoveries,
        'start_at', coalesce(start_at, clock_now() + coalesce(delay, interval '0')),
        'timeout_seconds', timeout_seconds, 'dedup_key', dedup_key, 'concurrency_key', concurrency_key)));
    IF NOT FOUND THEN
        SELECT e.name INTO owner_name FROM workflow_executions e WHERE e.id = new_id;
        IF owner_name IS NULL AND dedup_key IS NOT NULL THEN
            SELECT e.id INTO duplicate_id FROM workflow_executions e
            WHERE e.queue = queue AND e.dedup_key = dedup_key AND e.status IN ('enqueued', 'waiting', 'running');
            IF duplicate_id IS NOT NULL THEN
                RETURN duplicate_id;
            END IF;
        END IF;
        IF owner_name IS DISTINCT FROM workflow_name THEN
            RAISE EXCEPTION 'enqueue_workflow: workflow id % already belongs to workflow %', new_id, owner_name
                USING ERRCODE = '23505';
        END IF;
    END IF;
    RETURN new_id;
END;
$$;

REVOKE ALL ON FUNCTION clock_now(), notify_channel(text), insert_executions_v1(jsonb, jsonb, boolean) FROM PUBLIC;
