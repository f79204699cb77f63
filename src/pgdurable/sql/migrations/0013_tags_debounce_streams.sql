-- pgdurable schema, version 13: searchable tags, debounced enqueues, and streams.
--
-- Tags: a JSON object of string keys and values per execution (given at enqueue, added to by
-- pgdurable.set_tags), searched by containment (tags @> '{"customer": "42"}') along a GIN index.
-- Debounce: enqueues with the same (workflow, debounce key) while one is pending (not started yet) update
-- that one (its arguments, and a later start) instead of creating another; never later than the first
-- enqueue of the burst plus its maximum wait. Streams: values a workflow writes under a key, in order, read
-- from anywhere while it runs.
-- Creating executions now goes through insert_executions_v2 (it knows tags and debounce);
-- insert_executions_v1 keeps its signature for workers of the previous release and does what v2 does.

ALTER TABLE workflow_executions
    ADD COLUMN tags              jsonb CONSTRAINT workflow_executions_tags_object CHECK (jsonb_typeof(tags) = 'object'),
    ADD COLUMN debounce_key      text  CHECK (length(debounce_key) BETWEEN 1 AND 200),
    ADD COLUMN debounce_deadline timestamptz
        CONSTRAINT workflow_executions_debounce_deadline_range
        CHECK (debounce_deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00');

CREATE INDEX workflow_executions_tags_idx
    ON workflow_executions USING gin (tags jsonb_path_ops)
    WHERE tags IS NOT NULL;

CREATE UNIQUE INDEX workflow_executions_debounce_idx
    ON workflow_executions (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status IN ('enqueued', 'waiting');

CREATE TABLE workflow_streams (
    execution_id  text        NOT NULL,
    key           text        NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    step_id       integer     NOT NULL,
    value         jsonb,
    closed        boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, key, step_id),
    CHECK (closed = (value IS NULL))
);
ALTER TABLE workflow_streams SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02);

CREATE TRIGGER workflow_streams_notify
    AFTER INSERT ON workflow_streams
    FOR EACH ROW EXECUTE FUNCTION notify_event();

CREATE TYPE execution_spec_v2 AS (
    id                   text,
    name                 text,
    input                jsonb,
    queue                text,
    priority             integer,
    max_recoveries       integer,
    start_at             timestamptz,
    delay_seconds        double precision,
    timeout_seconds      double precision,
    deadline             timestamptz,
    dedup_key            text,
    concurrency_key      text,
    trace_context        jsonb,
    parent_id            text,
    forked_from          text,
    owner_id             text,
    lease_seconds        double precision,
    app_version          text,
    tags                 jsonb,
    debounce_key         text,
    debounce_seconds     double precision,
    debounce_max_seconds double precision
);

CREATE FUNCTION insert_executions_v2(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    created integer;
    debounced integer;
BEGIN
    RETURN QUERY
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, deadline, dedup_key, concurrency_key,
                                          trace_context, parent_id, forked_from, owner_id, lease_expires, attempt,
                                          started_at, app_version, created_at, updated_at, tags)
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
           s.app_version, at, at, nullif(nullif(s.tags, 'null'), '{}')
    FROM (
        SELECT p.*, p.owner_id IS NOT NULL AS owned,
               coalesce(p.start_at, at + make_interval(secs => coalesce(p.delay_seconds, 0))) AS available_at,
               p.owner_id IS NULL AND (p.delay_seconds > 0 OR p.start_at > at) AS delayed
        FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows))
                 WITH ORDINALITY AS p
        WHERE p.debounce_key IS NULL
        ORDER BY p.ordinality
    ) AS s
    ON CONFLICT DO NOTHING
    RETURNING e.id, e.name, e.status, e.attempt, e.input;
    GET DIAGNOSTICS created = ROW_COUNT;
    -- A bulk enqueue (no debounce key anywhere) pays one JSON path scan here, not a second parse of its rows.
    IF NOT (rows @? '$[*].debounce_key ? (@ != null)' OR coalesce(common -> 'debounce_key', 'null') <> 'null') THEN
        IF raise_on_conflict AND created < jsonb_array_length(rows) THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
                USING ERRCODE = '23505', DETAIL = 'insert_executions_v2: an id given is taken';
        END IF;
        RETURN;
    END IF;

    -- Debounced: one pending (not yet started) execution per (workflow, key). A later enqueue of the burst
    -- takes its place: its arguments and tags, and a start debounce_seconds from now, but never after the
    -- burst's deadline (its first enqueue plus debounce_max_seconds). A row a worker is claiming at this
    -- moment is waited for; once started it is no longer pending, so this insert starts the next burst.
    RETURN QUERY
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, concurrency_key, trace_context,
                                          created_at, updated_at, tags, debounce_key, debounce_deadline)
    SELECT s.id, s.name, coalesce(s.queue, 'default'), coalesce(s.priority, 0), coalesce(s.input, '{}'),
           coalesce(s.max_recoveries, 5), s.available_at,
           CASE WHEN s.available_at > at THEN 'waiting' ELSE 'enqueued' END,
           CASE WHEN s.available_at > at THEN 'delay' END,
           s.timeout_seconds, s.concurrency_key, nullif(s.trace_context, 'null'), at, at,
           nullif(nullif(s.tags, 'null'), '{}'), s.debounce_key, s.debounce_deadline
    FROM (
        SELECT p.*, least(at + make_interval(secs => coalesce(p.debounce_seconds, 0)), d.deadline) AS available_at,
               d.deadline AS debounce_deadline
        FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows))
                 WITH ORDINALITY AS p,
             LATERAL (SELECT at + make_interval(secs => p.debounce_max_seconds) AS deadline) AS d
        WHERE p.debounce_key IS NOT NULL
        ORDER BY p.ordinality
    ) AS s
    ON CONFLICT (name, debounce_key)
        WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status IN ('enqueued', 'waiting')
    DO UPDATE SET
        input = EXCLUDED.input, tags = EXCLUDED.tags, priority = EXCLUDED.priority,
        timeout_seconds = EXCLUDED.timeout_seconds, concurrency_key = EXCLUDED.concurrency_key,
        available_at = least(EXCLUDED.available_at, e.debounce_deadline),
        status = CASE WHEN least(EXCLUDED.available_at, e.debounce_deadline) > at THEN 'waiting' ELSE 'enqueued' END,
        wait_reason = CASE WHEN least(EXCLUDED.available_at, e.debounce_deadline) > at THEN 'delay' END,
        updated_at = at
    RETURNING e.id, e.name, e.status, e.attempt, e.input;
    GET DIAGNOSTICS debounced = ROW_COUNT;
    IF raise_on_conflict AND created + debounced < jsonb_array_length(rows) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
            USING ERRCODE = '23505', DETAIL = 'insert_executions_v2: an id given is taken';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION insert_executions_v1(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT * FROM insert_executions_v2(rows, common, raise_on_conflict);
$$;

-- The SQL API gains trailing arguments (tags, debounce); calls written for the old signature mean the same.
DROP FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer,
                               double precision, text, text);

CREATE FUNCTION enqueue_workflow(
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
    concurrency_key text        DEFAULT NULL,
    tags            jsonb       DEFAULT NULL,
    debounce_key    text        DEFAULT NULL,
    debounce_seconds     double precision DEFAULT NULL,
    debounce_max_seconds double precision DEFAULT NULL
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

    IF tags IS NOT NULL AND (jsonb_typeof(tags) <> 'object'
        OR (SELECT count(*) FROM jsonb_each(tags)) > 32
        OR EXISTS (SELECT 1 FROM jsonb_each(tags) t
                   WHERE jsonb_typeof(t.value) <> 'string' OR length(t.key) NOT BETWEEN 1 AND 100
                      OR length(t.value #>> '{}') > 200)) THEN
        RAISE EXCEPTION 'enqueue_workflow: tags must be a JSON object of at most 32 string values, keys of 1 to '
                        '100 characters and values of at most 200'
            USING ERRCODE = '22023', HINT = 'for example: ''{"customer": "42"}''::jsonb';
    END IF;
    IF debounce_key IS NOT NULL THEN
        IF length(debounce_key) NOT BETWEEN 1 AND 200 THEN
            RAISE EXCEPTION 'enqueue_workflow: debounce_key must be 1 to 200 characters' USING ERRCODE = '22023';
        END IF;
        IF workflow_id IS NOT NULL OR dedup_key IS NOT NULL OR start_at IS NOT NULL OR delay IS NOT NULL THEN
            RAISE EXCEPTION 'enqueue_workflow: a debounced enqueue takes no workflow_id, dedup_key, start_at or '
                            'delay (the burst decides its id and its start)'
                USING ERRCODE = '22023';
        END IF;
        IF debounce_seconds IS NULL OR NOT (debounce_seconds >= 0 AND debounce_seconds <= 315360000)
           OR NOT (debounce_max_seconds IS NULL
                   OR (debounce_max_seconds >= 0 AND debounce_max_seconds <= 315360000)) THEN
            RAISE EXCEPTION 'enqueue_workflow: debounce_seconds (given) and debounce_max_seconds (optional) must be '
                            'finite numbers of seconds from 0 to 315360000 (10 years)'
                USING ERRCODE = '22023';
        END IF;
        RETURN (SELECT i.id FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
            'id', new_id, 'name', workflow_name, 'input', input, 'queue', queue, 'priority', priority,
            'max_recoveries', max_recoveries, 'timeout_seconds', timeout_seconds,
            'concurrency_key', concurrency_key, 'tags', tags, 'debounce_key', debounce_key,
            'debounce_seconds', debounce_seconds, 'debounce_max_seconds', debounce_max_seconds))) AS i);
    ELSIF debounce_seconds IS NOT NULL OR debounce_max_seconds IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_workflow: debounce_seconds and debounce_max_seconds need a debounce_key'
            USING ERRCODE = '22023';
    END IF;

    PERFORM FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', new_id, 'name', workflow_name, 'input', input, 'queue', queue, 'priority', priority,
        'max_recoveries', max_recoveries,
        'start_at', coalesce(start_at, clock_now() + coalesce(delay, interval '0')),
        'timeout_seconds', timeout_seconds, 'dedup_key', dedup_key, 'concurrency_key', concurrency_key,
        'tags', tags)));
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

CREATE OR REPLACE FUNCTION apply_application_grants(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.enqueue_workflow(text, jsonb, text, text, integer, '
                   'timestamptz, interval, integer, double precision, text, text, jsonb, text, double precision, '
                   'double precision), %1$I.workflow_status(text), '
                   '%1$I.cancel_workflow(text), %1$I.send_message(text, jsonb, text, text), '
                   '%1$I.workflow_event(text, text) TO %2$I', schema_name, role_name);
END;
$$;

REVOKE ALL ON FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer,
                                        double precision, text, text, jsonb, text, double precision,
                                        double precision),
                       insert_executions_v2(jsonb, jsonb, boolean)
    FROM PUBLIC;
