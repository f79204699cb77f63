-- pgdurable schema, version 18: a finished execution notifies only if someone waits for it.
--
-- Every completion used to NOTIFY its result waiters, whether or not there were any, and PostgreSQL
-- serialises the commits of notifying transactions: the workers' completions queued behind one lock. A
-- result wait now registers its execution (awaited_executions) before it sleeps, reading it FOR SHARE so
-- that a completion in flight is either seen finished by the wait or sees the registration; the completion
-- deletes the registration and notifies.

-- Executions someone waits for the outcome of (a result wait outside workflows registers its execution
-- before it sleeps): their completion alone sends a NOTIFY ("_done"), so finishing work nobody waits for
-- does not serialise the workers' commits. The registration reads the execution FOR SHARE (query
-- await_status), which orders it with a completion in flight: either the wait sees the finished status, or
-- the completion, which deletes the row, sees the registration.
CREATE TABLE awaited_executions (
    execution_id text        PRIMARY KEY,
    since        timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM ring_doorbells(ARRAY[NEW.queue]);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        -- Only a finished execution someone waits for notifies its waiters (see awaited_executions).
        DELETE FROM awaited_executions a WHERE a.execution_id = NEW.id;
        IF FOUND THEN
            PERFORM pg_notify(notify_channel('done'), NEW.id);
        END IF;
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
