-- pgdurable schema, version 31: enqueue_workflow's execution in one INSERT, and its test of the tags split in two.
--
-- enqueue_workflow created its execution through insert_executions_v2: a JSON object built, read back into a
-- record, a table function's result, the batch's steps (ordering, the debounce scan). For the one execution
-- of a call that cost about 110 us of backend CPU of about 400. insert_execution_v1 writes the same row with
-- one plain INSERT (tests/test_enqueue_rows.py holds it to the function's rows), and rings the bells only for
-- a row claimable now, as app.enqueue's statement does. Debounced calls keep insert_executions_v2. The test of
-- the tags was one IF whose condition holds subqueries (jsonb_each): PL/pgSQL ran it through the executor at
-- every call, even with no tags; `tags IS NOT NULL` is now tested on its own first. Same signature, same
-- rules, same errors (docs/benchmarks.md, "Enqueue through SQL: one INSERT"). The Citus layout's script of
-- this number makes insert_execution_v1 call its routed insert_executions_v2.
CREATE FUNCTION insert_execution_v1(
    new_id text, workflow_name text, input jsonb, queue text, priority integer, max_recoveries integer,
    start_at timestamptz, timeout_seconds double precision, dedup_key text, concurrency_key text, tags jsonb
) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at constant timestamptz := clock_now();
    delayed constant boolean := start_at > at;
BEGIN
    INSERT INTO workflow_executions (id, name, queue, priority, input, max_recoveries, available_at, status,
                                     wait_reason, timeout_seconds, dedup_key, concurrency_key, created_at,
                                     updated_at, tags)
    VALUES (new_id, workflow_name, queue, priority, input, max_recoveries, start_at,
            CASE WHEN delayed THEN 'waiting' ELSE 'enqueued' END, CASE WHEN delayed THEN 'delay' END,
            timeout_seconds, dedup_key, concurrency_key, at, at, nullif(nullif(tags, 'null'), '{}'))
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT delayed AND EXISTS (SELECT FROM worker_doorbells WHERE armed) THEN
        PERFORM ring_doorbells(ARRAY[queue]);
    END IF;
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION insert_execution_v1(text, text, jsonb, text, integer, integer, timestamptz, double precision,
                                           text, text, jsonb) FROM PUBLIC;

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
    new_id text := coalesce(workflow_id, new_execution_id());
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

    -- Two IFs, not one: a condition with a subquery is run by the executor, set up anew at every call (about
    -- 20 us), even when tags is NULL; the outer test alone is a simple expression (migration 31).
    IF tags IS NOT NULL THEN
        IF jsonb_typeof(tags) <> 'object'
            OR (SELECT count(*) FROM jsonb_each(tags)) > 32
            OR EXISTS (SELECT 1 FROM jsonb_each(tags) t
                       WHERE jsonb_typeof(t.value) <> 'string' OR length(t.key) NOT BETWEEN 1 AND 100
                          OR length(t.value #>> '{}') > 200) THEN
            RAISE EXCEPTION 'enqueue_workflow: tags must be a JSON object of at most 32 string values, keys of 1 '
                            'to 100 characters and values of at most 200'
                USING ERRCODE = '22023', HINT = 'for example: ''{"customer": "42"}''::jsonb';
        END IF;
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

    IF insert_execution_v1(new_id, workflow_name, input, queue, priority, max_recoveries,
                           coalesce(start_at, clock_now() + coalesce(delay, interval '0')), timeout_seconds,
                           dedup_key, concurrency_key, tags) THEN
        RETURN new_id;
    END IF;
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
    RETURN new_id;
END;
$$;
