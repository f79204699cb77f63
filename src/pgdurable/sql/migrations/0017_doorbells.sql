-- pgdurable schema, version 17: wake-ups only for workers that sleep (doorbells).
--
-- Every enqueue used to NOTIFY, and PostgreSQL serialises the commits of notifying transactions (one lock,
-- held through the commit's WAL flush): an application enqueuing inside its own transactions lost half its
-- write throughput to wake-ups that busy workers did not need. Now a worker arms a doorbell per queue when
-- it is about to sleep, and an enqueue notifies only if it disarms an armed bell: one NOTIFY per worker's
-- sleep, none while the workers are busy (they claim again without being told).

-- One bell per (queue, worker) that claims from it: armed while the worker sleeps on that queue.
CREATE TABLE worker_doorbells (
    queue     text    NOT NULL,
    worker_id text    NOT NULL,
    armed     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (queue, worker_id)
) WITH (fillfactor = 50);

-- Ring the armed bells of these queues: disarm them and NOTIFY each queue that had one. A bell another
-- transaction is ringing right now is skipped (its NOTIFY wakes the same workers), so concurrent enqueuers
-- never wait for each other here. Returns how many queues were notified.
-- (PL/pgSQL, not SQL, with one generic plan: an enqueue's trigger calls it, and PostgreSQL would otherwise
-- plan its statement anew for each array of queues, at about 0.1 ms a time.)
CREATE FUNCTION ring_doorbells(queues text[]) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    notified bigint;
BEGIN
    WITH rung AS (
        UPDATE worker_doorbells d SET armed = false
        FROM (SELECT b.queue, b.worker_id FROM worker_doorbells b
              WHERE b.queue = ANY (queues) AND b.armed
              FOR UPDATE SKIP LOCKED) AS r
        WHERE d.queue = r.queue AND d.worker_id = r.worker_id
        RETURNING d.queue
    )
    SELECT count(pg_notify(notify_channel('work'), q.queue)) INTO notified
    FROM (SELECT DISTINCT queue FROM rung) AS q;
    RETURN notified;
END;
$$;
REVOKE ALL ON FUNCTION ring_doorbells(text[]) FROM PUBLIC;

-- Enqueues ring from the one insert path (insert_executions_v2, which enqueue_workflow, schedules, children
-- and table bindings all use) rather than from a statement trigger: the trigger's transition table and event
-- queue cost the enqueuing transactions more than the look at the bells does.
DROP TRIGGER workflow_executions_notify_insert ON workflow_executions;
DROP FUNCTION notify_enqueued();

CREATE OR REPLACE FUNCTION insert_executions_v2(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
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
    -- Wake the workers sleeping on these queues (doorbells): most of the time none sleeps (busy workers claim
    -- again on their own), and one cheap look is all this costs.
    IF EXISTS (SELECT FROM worker_doorbells WHERE armed) THEN
        PERFORM ring_doorbells(ARRAY(
            SELECT DISTINCT coalesce(p.queue, 'default')
            FROM jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows) AS p));
    END IF;
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

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM ring_doorbells(ARRAY[NEW.queue]);
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
                available_at = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN clock_now()
                                    ELSE p.available_at END
            WHERE p.id = NEW.parent_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

