-- pgdurable schema, version 1.
-- Runs with search_path set to the target schema (default "pgdurable"), so names stay unqualified.

-- One row per workflow execution. Kept narrow on purpose: the claim path updates status, owner and lease
-- many times per second, and a lower fillfactor leaves room for those updates to stay HOT.
CREATE TABLE workflow_executions (
    id              text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    name            text        NOT NULL,
    queue           text        NOT NULL DEFAULT 'default' CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    status          text        NOT NULL DEFAULT 'enqueued'
                                CHECK (status IN ('enqueued', 'running', 'succeeded', 'failed', 'cancelled')),
    priority        integer     NOT NULL DEFAULT 0,
    -- Enqueue order, the tiebreaker after priority (many rows share one created_at: a bulk enqueue's
    -- transaction time).
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    input           jsonb       NOT NULL DEFAULT '{}',
    output          jsonb,
    error           jsonb,
    owner_id        text,
    lease_expires   timestamptz,
    -- The fencing token: incremented by every claim. A write made for attempt N succeeds only while the
    -- row still says N and is running, so a worker that lost its lease cannot write.
    attempt         integer     NOT NULL DEFAULT 0,
    -- How many times a lease expired while running (a crashed or stuck worker). Past max_recoveries the
    -- execution is dead-lettered (failed) instead of crashing yet another worker.
    recoveries      integer     NOT NULL DEFAULT 0,
    max_recoveries  integer     NOT NULL DEFAULT 5,
    available_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    completed_at    timestamptz,
    CHECK ((status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL))
) WITH (fillfactor = 70);

-- The claim path: the most urgent, then oldest, enqueued executions of a queue.
CREATE INDEX workflow_executions_claim_idx
    ON workflow_executions (queue, priority, seq)
    WHERE status = 'enqueued';

-- The sweeper: running executions by lease expiry.
CREATE INDEX workflow_executions_lease_idx
    ON workflow_executions (lease_expires)
    WHERE status = 'running';

-- Listing and retention.
CREATE INDEX workflow_executions_created_idx ON workflow_executions (created_at);

-- One row per completed step of an execution: its recorded output or error. Written once.
-- No foreign key on purpose: every insert already joins the execution row to check ownership (fencing),
-- and a per-row FK check would double that work on the hottest path. Deleting an execution deletes its
-- steps explicitly.
CREATE TABLE operation_outputs (
    execution_id    text        NOT NULL,
    step_id         integer     NOT NULL,
    step_name       text        NOT NULL,
    output          jsonb,
    error           jsonb,
    attempts        integer     NOT NULL DEFAULT 1,
    -- the execution attempt (fencing token) that recorded this step
    recorded_by_attempt integer NOT NULL,
    started_at      timestamptz NOT NULL,
    completed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, step_id)
);

-- Live worker processes, so that work no live worker can run is visible.
CREATE TABLE workers (
    id              text        PRIMARY KEY,
    hostname        text        NOT NULL,
    pid             integer     NOT NULL,
    queues          text[]      NOT NULL,
    workflows       text[]      NOT NULL,
    concurrency     integer     NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now()
);

-- Wake workers when work becomes available, and result waiters when an execution ends. Triggers (not the
-- client) send these so that every writer, in any language, wakes everybody; NOTIFY is delivered on commit
-- and identical payloads within a transaction are folded into one.
CREATE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_work', NEW.queue);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_done', NEW.id);
    END IF;
    RETURN NULL;
END;
$$;

-- Inserts notify once per statement and queue, so a bulk enqueue of thousands of rows sends one NOTIFY.
CREATE FUNCTION notify_enqueued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_work', queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'enqueued') AS queues;
    RETURN NULL;
END;
$$;

CREATE TRIGGER workflow_executions_notify_insert
    AFTER INSERT ON workflow_executions
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION notify_enqueued();

CREATE TRIGGER workflow_executions_notify_update
    AFTER UPDATE OF status ON workflow_executions
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_execution_change();

-- Enqueued executions that no live worker can run: either nobody serves their queue, or the workers that
-- serve it do not know the workflow's name (a typo, or a deploy still rolling out).
CREATE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND w.heartbeat_at > now() - interval '2 minutes')
            THEN 'no live worker serves queue ' || e.queue
            ELSE 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
       END AS reason
FROM workflow_executions e
WHERE e.status = 'enqueued'
  AND NOT EXISTS (SELECT 1 FROM workers w
                  WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                    AND w.heartbeat_at > now() - interval '2 minutes');
