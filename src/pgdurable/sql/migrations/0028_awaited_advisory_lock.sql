-- pgdurable schema, version 28: a result wait's registration and its execution's completion are ordered by
-- an advisory lock instead of row locks.
--
-- Since version 21 the registration (await_execution_v2) locked the execution's row FOR KEY SHARE and the
-- completion's trigger locked the finished row FOR UPDATE, so that one waited for the other. PostgreSQL can
-- drop such a FOR KEY SHARE lock: an UPDATE whose new row version goes to another page, or whose values are
-- stored out of line (TOAST), marks the old version locked and lets go of its page while it works; a FOR KEY
-- SHARE taken in that moment does not conflict with that mark, is recorded on the old version, and is then
-- overwritten when the update completes. The completion then looked for registrations without waiting for
-- the one in flight, and its waiter slept until its re-check: in tests/test_wakeups.py's race with outcomes
-- stored out of line, 7 to 26 of every 31 to 48 waits that raced a completion (PostgreSQL 15.20).
--
-- Now both take the same advisory lock, held until their transaction ends: the registration exclusively, the
-- completion's trigger shared (completions never wait for each other, so a statement finishing many
-- executions cannot deadlock with another). The lock is keyed by the table awaited_executions and one of
-- 1,024 buckets of the execution id's hash, not the id itself: a statement that finishes 20,000 executions
-- (a bulk cancel) would otherwise hold 20,000 locks and fail with "out of shared memory" on a server with
-- the default max_locks_per_transaction; it now holds at most 1,024. A registration (one short statement)
-- waits for the completions in flight in its bucket. No row is locked by a registration any more, so a
-- claim never meets one.

-- The status of an execution about to be waited for, registering an unfinished one as awaited (its
-- completion then notifies); one round trip. A finished one is only read. For an unfinished one the wait
-- takes the registration lock of the id's bucket (exclusively; a completing execution holds it shared from
-- its trigger until it commits), then reads again in a statement of its own, which sees a completion that
-- committed while the lock waited for it. Either the wait sees the finished status, or the completion,
-- waiting for the registration's lock, sees the registration. With carry_result, the completion's
-- notification carries the outcome ("_result"); without, it carries the id ("_done"). seen: the snapshot of
-- the look that found it unfinished. A "_result" notification names the transaction that sent it: one
-- visible in seen finished an earlier run (before a resume), and its outcome is not this wait's.
CREATE OR REPLACE FUNCTION await_execution_v2(awaited_id text, carry_result boolean)
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
        PERFORM pg_advisory_xact_lock('awaited_executions'::regclass::oid::integer, hashtext(awaited_id) & 1023);
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
        -- waiter registering right now holds the registration lock of the id's bucket (await_execution_v2);
        -- taking it shared waits for that registration to commit, and the DELETE below, a new statement,
        -- sees it. Completions share the lock, so they never wait for each other.
        PERFORM pg_advisory_xact_lock_shared('awaited_executions'::regclass::oid::integer, hashtext(NEW.id) & 1023);
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
