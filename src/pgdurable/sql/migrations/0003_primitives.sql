-- pgdurable schema, version 3: what workflows wait on (durable time, messages, child workflows), events,
-- deadlines, lineage (parents, forks) and application versions.

-- 'waiting': the execution holds no worker slot. It sleeps until available_at (a durable sleep, a delayed
-- start, the timeout of a wait), unless something it waits for wakes it sooner (a message on its topic, a
-- child that finished). Waiting executions stay out of the claim index, so a million sleeping workflows
-- do not slow claims down; a timer in every worker moves those that are due back to 'enqueued'.
ALTER TABLE workflow_executions DROP CONSTRAINT workflow_executions_status_check;
ALTER TABLE workflow_executions ADD CONSTRAINT workflow_executions_status_check
    CHECK (status IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled'));

-- A waiting execution with no wake-up time (NULL) waits until something wakes it.
ALTER TABLE workflow_executions ALTER COLUMN available_at DROP NOT NULL;

ALTER TABLE workflow_executions
    -- What a waiting execution waits for: 'delay', 'sleep', 'recv:<topic>' or 'children'. Only a matching
    -- event wakes it early; its own available_at wakes it in any case.
    ADD COLUMN wait_reason     text,
    -- Bumped by everything that may satisfy a wait (a message sent to it, a child that finished). A worker
    -- suspends an execution only if this did not change since it looked for what it waits for, so a wake-up
    -- that lands in between is never lost.
    ADD COLUMN wakeups         bigint      NOT NULL DEFAULT 0,
    -- The execution that started this one as a child; cancellation cascades down this link and a finished
    -- child wakes its parent.
    ADD COLUMN parent_id       text,
    -- The execution this one was forked from (App.fork), for lineage.
    ADD COLUMN forked_from     text,
    -- A time budget counted from the first start; the deadline is fixed then (or inherited from a parent,
    -- whichever is earlier). Past it the execution fails with pgdurable.WorkflowTimeout.
    ADD COLUMN timeout_seconds double precision CHECK (timeout_seconds > 0),
    ADD COLUMN deadline        timestamptz,
    -- The application version that started the execution; only workers of that version resume it.
    ADD COLUMN app_version     text;

-- The timer: waiting executions by wake-up time.
CREATE INDEX workflow_executions_wake_idx
    ON workflow_executions (available_at)
    WHERE status = 'waiting';

-- Children of a parent (cascading cancellation, the dashboard).
CREATE INDEX workflow_executions_parent_idx
    ON workflow_executions (parent_id)
    WHERE parent_id IS NOT NULL;

-- Unfinished executions with a deadline, for the sweeper.
CREATE INDEX workflow_executions_deadline_idx
    ON workflow_executions (deadline)
    WHERE deadline IS NOT NULL AND status IN ('enqueued', 'waiting', 'running');

ALTER TABLE workers ADD COLUMN app_version text;

-- Messages sent to an execution. A receive marks one consumed in the same statement that records the
-- receive as a step, so each message is returned exactly once, in the order sent. Kept after consumption
-- (for inspection) until the execution is deleted.
CREATE TABLE workflow_messages (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination_id   text        NOT NULL,
    topic            text        NOT NULL DEFAULT '' CHECK (length(topic) <= 200),
    message          jsonb       NOT NULL,
    -- A sender that may retry gives a key: the same key for the same destination is stored once.
    idempotency_key  text        CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    created_at       timestamptz NOT NULL DEFAULT now(),
    consumed_at      timestamptz,
    consumed_by_step integer,
    CONSTRAINT workflow_messages_idempotency UNIQUE (destination_id, idempotency_key)
);

CREATE INDEX workflow_messages_pending_idx
    ON workflow_messages (destination_id, topic, id)
    WHERE consumed_at IS NULL;

-- Events an execution publishes (set_event): every value is kept; the latest per key is the current one.
-- step_id is the set_event step that wrote it, which orders a key's history.
CREATE TABLE workflow_events (
    execution_id  text        NOT NULL,
    key           text        NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    step_id       integer     NOT NULL,
    value         jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, key, step_id)
);

CREATE FUNCTION notify_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_event', NEW.execution_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER workflow_events_notify
    AFTER INSERT ON workflow_events
    FOR EACH ROW EXECUTE FUNCTION notify_event();

-- Status changes: wake workers for enqueued work, wake result waiters for finished executions, tell the
-- owner of a running execution that was cancelled or timed out to stop at once, and wake a parent
-- waiting on a child that finished.
CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_work', NEW.queue);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_done', NEW.id);
        IF OLD.status = 'running' AND (NEW.status = 'cancelled' OR NEW.error ->> 'type' = 'pgdurable.WorkflowTimeout') THEN
            PERFORM pg_notify(TG_TABLE_SCHEMA || '_stop', NEW.id);
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

-- Enqueued executions that no live worker can run: nobody serves their queue, the workers that serve it
-- do not know the workflow's name, or none of them runs the application version that started it.
CREATE OR REPLACE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND w.heartbeat_at > now() - interval '2 minutes')
            THEN 'no live worker serves queue ' || e.queue
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                               AND w.heartbeat_at > now() - interval '2 minutes')
            THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
            ELSE 'no live worker runs application version ' || e.app_version
       END AS reason
FROM workflow_executions e
WHERE e.status = 'enqueued'
  AND NOT EXISTS (SELECT 1 FROM workers w
                  WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                    AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version)
                    AND w.heartbeat_at > now() - interval '2 minutes');

-- (enqueue_workflow learns delayed starts in 'waiting', timeouts and keys in migration 5.)

-- Cancel an execution and, down the parent links, every unfinished descendant; true if the execution
-- itself was cancelled. A running one stops at once (its owner is notified) and writes nothing more.
CREATE OR REPLACE FUNCTION cancel_workflow(workflow_id text) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH RECURSIVE tree AS (
        SELECT e.id FROM workflow_executions e WHERE e.id = workflow_id
        UNION
        SELECT c.id FROM workflow_executions c JOIN tree t ON c.parent_id = t.id
    ), cancelled AS (
        UPDATE workflow_executions e
        SET status = 'cancelled', owner_id = NULL, lease_expires = NULL, wait_reason = NULL,
            completed_at = now(), updated_at = now()
        FROM tree
        WHERE e.id = tree.id AND e.status IN ('enqueued', 'waiting', 'running')
        RETURNING e.id
    )
    SELECT count(*) FILTER (WHERE id = workflow_id) > 0 FROM cancelled;
$$;

-- Send a message to an execution, from any language and inside the caller's transaction: delivered if
-- and only if that transaction commits. Returns false when the idempotency key was already used for this
-- destination (nothing new stored). Raises if the destination does not exist.
CREATE FUNCTION send_message(destination_id text, message jsonb, topic text DEFAULT '',
                             idempotency_key text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    IF message IS NULL THEN
        RAISE EXCEPTION 'send_message: message must not be NULL (send JSON ''null'' instead)'
            USING ERRCODE = '22023';
    END IF;
    IF topic IS NULL OR length(topic) > 200 THEN
        RAISE EXCEPTION 'send_message: topic must be a string of at most 200 characters' USING ERRCODE = '22023';
    END IF;
    IF octet_length(message::text) > 8388608 THEN
        RAISE EXCEPTION 'send_message: message is % bytes of JSON; the limit is 8 MiB', octet_length(message::text)
            USING ERRCODE = '54000';
    END IF;
    -- Count the wake-up before storing the message (this also locks the destination row): a receiver
    -- that just looked for messages and is about to suspend sees the count change and looks again.
    UPDATE workflow_executions e
    SET wakeups = e.wakeups + 1,
        status = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN 'enqueued'
                      ELSE e.status END,
        available_at = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN now()
                            ELSE e.available_at END
    WHERE e.id = destination_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send_message: no workflow execution has id %', quote_nullable(destination_id)
            USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO workflow_messages (destination_id, topic, message, idempotency_key)
    VALUES (destination_id, topic, message, idempotency_key)
    ON CONFLICT ON CONSTRAINT workflow_messages_idempotency DO NOTHING;
    RETURN FOUND;
END;
$$;

-- The latest value an execution published under a key; no row if none yet.
CREATE FUNCTION workflow_event(workflow_id text, key text)
RETURNS TABLE (value jsonb, created_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT ev.value, ev.created_at FROM workflow_events ev
    WHERE ev.execution_id = workflow_id AND ev.key = workflow_event.key
    ORDER BY ev.step_id DESC
    LIMIT 1;
$$;

REVOKE ALL ON FUNCTION send_message(text, jsonb, text, text), workflow_event(text, text) FROM PUBLIC;
