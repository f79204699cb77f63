-- pgdurable schema, version 27: a result wait is handed the outcome in its completion's notification.
--
-- A waiter woken by "_done" (payload: the id) then read the execution's row: one more round trip between a
-- result being committed and seen. A registration now says whether its waiter reads the outcome from the
-- notification (awaited_executions.carry_result, set by await_execution_v2); the completion then notifies
-- on "_result" with the id, the status and the output (or the error), unless that would not fit in a
-- NOTIFY payload, when the waiter reads as before. Waiters of the previous release register through
-- await_execution_v1 and are still notified on "_done".

CREATE OR REPLACE FUNCTION notify_channel(kind text) RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF kind IS NULL OR kind NOT IN ('work', 'done', 'result', 'stop', 'event', 'schedules') THEN
        RAISE EXCEPTION 'notify_channel: unknown channel kind %', quote_nullable(kind) USING ERRCODE = '22023';
    END IF;
    RETURN current_schema() || '_' || kind;
END;
$$;

-- A schema with the Citus layout registers and notifies its waiters its own way (sql/citus/0018, the query
-- await_status of sql/queries/citus/), so its distributed awaited_executions is left as it is.
DO $do$
BEGIN
    IF to_regprocedure('citus_buckets()') IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE $ddl$
        ALTER TABLE awaited_executions
            ADD COLUMN carry_result boolean NOT NULL DEFAULT false,
            DROP CONSTRAINT awaited_executions_pkey,
            ADD PRIMARY KEY (execution_id, carry_result)
    $ddl$;
END;
$do$;

-- The status of an execution about to be waited for, registering an unfinished one as awaited (its
-- completion then notifies); one round trip. A finished one is only read. An unfinished one is locked FOR
-- KEY SHARE, a lock that a claim (FOR NO KEY UPDATE SKIP LOCKED) does not skip and that a completion waits
-- for (its trigger locks the finished row FOR UPDATE before it looks for registrations), then read again in
-- a statement of its own, which sees a completion that committed while the lock waited for it. Either the
-- wait sees the finished status, or the completion sees the registration. With carry_result, the
-- completion's notification carries the outcome ("_result"); without, it carries the id ("_done"). seen:
-- the snapshot of the look that found it unfinished. A "_result" notification names the transaction that
-- sent it: one visible in seen finished an earlier run (before a resume), and its outcome is not this wait's.
CREATE FUNCTION await_execution_v2(awaited_id text, carry_result boolean)
RETURNS TABLE (status text, output jsonb, error jsonb, seen pg_snapshot)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    SELECT e.status, e.output, e.error INTO status, output, error FROM workflow_executions e WHERE e.id = awaited_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF status NOT IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM FROM workflow_executions e WHERE e.id = awaited_id FOR KEY SHARE;
        SELECT e.status, e.output, e.error, pg_current_snapshot() INTO status, output, error, seen
        FROM workflow_executions e WHERE e.id = awaited_id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF status NOT IN ('succeeded', 'failed', 'cancelled') THEN
            INSERT INTO awaited_executions AS a (execution_id, carry_result) VALUES (awaited_id, carry_result)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION await_execution_v2(text, boolean) FROM PUBLIC;

-- The previous release's registration: notified on "_done" with the id.
CREATE OR REPLACE FUNCTION await_execution_v1(awaited_id text)
RETURNS TABLE (status text, output jsonb, error jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT a.status, a.output, a.error FROM await_execution_v2(awaited_id, false) AS a;
END;
$$;

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    carried boolean;
    payload text;
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM ring_doorbells(ARRAY[NEW.queue]);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        -- Only a finished execution someone waits for notifies its waiters (see awaited_executions). A
        -- waiter registering right now holds the row FOR KEY SHARE (await_execution_v2), which this lock
        -- waits for: the DELETE below, a new statement, then sees its registration.
        PERFORM FROM workflow_executions e WHERE e.id = NEW.id FOR UPDATE;
        FOR carried IN DELETE FROM awaited_executions a WHERE a.execution_id = NEW.id RETURNING a.carry_result LOOP
            IF carried THEN
                -- A JSON array [id, status, this transaction's id], a newline, then the output of a success
                -- or the error of a failure as stored (jsonb's text; nothing for NULL). An outcome too long
                -- for a payload (under 8000 bytes) is left out: [id] alone, and the waiter reads it.
                payload := jsonb_build_array(NEW.id, NEW.status, pg_current_xact_id()::text)::text || E'\n'
                    || coalesce((CASE WHEN NEW.status = 'succeeded' THEN NEW.output ELSE NEW.error END)::text, '');
                IF octet_length(payload) >= 8000 THEN
                    payload := jsonb_build_array(NEW.id)::text;
                END IF;
                PERFORM pg_notify(notify_channel('result'), payload);
            ELSE
                PERFORM pg_notify(notify_channel('done'), NEW.id);
            END IF;
        END LOOP;
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
