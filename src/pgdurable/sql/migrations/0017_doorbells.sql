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
-- (PL/pgSQL, not SQL: an enqueue's trigger calls it, and PL/pgSQL keeps its plans for the session.)
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

CREATE OR REPLACE FUNCTION notify_enqueued() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    -- Most of the time no worker sleeps (busy workers claim again on their own): one cheap look first.
    IF EXISTS (SELECT FROM worker_doorbells WHERE armed) THEN
        PERFORM ring_doorbells(ARRAY(SELECT DISTINCT queue FROM inserted WHERE status = 'enqueued'));
    END IF;
    RETURN NULL;
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

-- The functions on the hot paths plan their statements once per session. PL/pgSQL keeps a statement's plan,
-- but by default re-plans it for every call's parameter values while its generic plan looks costlier, and
-- planning was the larger half of an enqueue's server time (their statements have no parameter for which
-- a custom plan is better: they find rows by key).
ALTER FUNCTION insert_executions_v2(jsonb, jsonb, boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer, double precision,
                                text, text, jsonb, text, double precision, double precision)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION send_message(text, jsonb, text, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION checkpoint_step(text, integer, integer, text, jsonb, jsonb, integer, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION claim_with_policy_v2(text, text[], text, double precision, integer, text, double precision)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION table_binding_fire() SET plan_cache_mode = force_generic_plan;
