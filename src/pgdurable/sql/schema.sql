-- pgdurable: the current schema, in one file, as a newcomer should read it.
--
-- What this file is. A database is upgraded by the numbered migrations in sql/migrations/ (applied in order
-- by migrations.py, recorded in schema_migrations). Migrations are history: to learn what enqueue_workflow
-- does today you would otherwise have to read 0002, then 0005, then 0008. This file is the result: every
-- table, index, view, function and trigger in its latest definition, ordered by concept. A NEW single-node
-- schema is created by this file alone, with every migration recorded as applied (less than half the
-- server's work of replaying them; the Citus layout still replays them, its scripts interleaved).
-- tests/test_schema_sql.py replays every migration into one schema and runs this file into another and
-- compares them in the catalogs (columns, constraints, indexes, function text, triggers, views, storage
-- options, privileges) and in the rows the migrations leave in their tables, so this file cannot drift from
-- what the migrations produce.
--
-- It runs, like every migration, with search_path set to "<schema>, pg_temp" (default schema "pgdurable"),
-- so names are unqualified and SET search_path FROM CURRENT pins that path into every function.
--
-- Rules for changing the schema:
-- 1. Never edit a released migration. Add sql/migrations/NNNN_what.sql, then update this file to match
--    (the test tells you what differs).
-- 2. A SQL function whose signature changes (arguments or result) gets a NEW, versioned name
--    (insert_executions_v1 -> insert_executions_v2) and the old one stays until no released worker calls
--    it: during a blue-green deploy old and new workers run side by side on one schema, and an old worker
--    must keep finding the function it was written against. A body-only change may CREATE OR REPLACE in
--    place if old callers keep their meaning. (enqueue_workflow is the public API and keeps its name; it
--    only ever gains trailing arguments with defaults.)
-- 3. Every function, trigger functions included, gets SET search_path FROM CURRENT and, unless everybody
--    may call it, REVOKE ALL ... FROM PUBLIC. (One exception, clock_now(): a SQL function with a standard
--    body, whose names are bound when it is created, and no SET clause, so that it is inlined.) The
--    migration runner re-applies the recorded roles' grants after every migration; a function for the
--    application role is added to apply_application_grants.
-- 4. Time in the engine's SQL is the database's (never a client's clock), on one of two clocks (see "The
--    clock" below). Durable time, clock_now(): when something may or must happen (available_at, wake-ups,
--    deadlines, schedules' ticks, retention cutoffs) and the timeline recorded for executions (created_at,
--    started_at, completed_at, updated_at, steps', messages' and events' times). Liveness time, now():
--    leases, heartbeats, the worker registry, rate-limit windows (and the stamps of definitions: a queue's or
--    a schedule's created_at, updated_at). Tests move durable time (fake_now, or the skipping clock of
--    pgdurable.testing); liveness time always runs at the wall clock's pace.

-- == The migration history =============================================================================

-- Created by the migration runner (migrations.py), not by a migration: one row per applied migration.
CREATE TABLE schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- == Executions ========================================================================================

-- The rules every row of workflow_executions keeps, checked by its one CHECK constraint. One function
-- rather than a constraint per rule: PostgreSQL reads a table's CHECK expressions back from their stored
-- text and prepares them for every statement that writes the table, and twelve of them cost each insert
-- about 0.1 ms and each claim or completion 60 us (pgbench); a call to this function, whose statements
-- PL/pgSQL plans once per session, costs a fraction of that. A broken rule is reported as before: SQLSTATE
-- 23514, with the name the rule's own constraint had. (A schema with the Citus layout keeps one constraint
-- per rule: see migration 25.)
CREATE FUNCTION check_execution_row(
    id text, queue text, status text, owner_id text, lease_expires timestamptz, timeout_seconds double precision,
    available_at timestamptz, deadline timestamptz, concurrency_key text, dedup_key text, debounce_key text,
    debounce_deadline timestamptz, tags jsonb
) RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    broken text;
BEGIN
    -- Every rule at once first, as one small expression: what nearly every row takes. PL/pgSQL prepares an
    -- expression again in each transaction that evaluates it, and the CASE below, named rule by rule, cost
    -- every insert and update of the table about 15 us more than this one does (backend CPU, migration 30).
    -- Only a row this does not pass (false or NULL) is looked at rule by rule, and the CASE decides.
    IF length(id) BETWEEN 1 AND 200
       -- a queue name: 1 to 100 of these characters, all of which ltrim takes off (a regular expression
       -- cost each row about 3 us more, migration 32)
       AND length(queue) BETWEEN 1 AND 100
       AND ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
       AND status IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled')
       AND (status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL)
       AND coalesce(timeout_seconds > 0 AND timeout_seconds <= 315360000, true)
       -- least and greatest skip NULLs: every time given is within the range
       AND coalesce(least(available_at, deadline, debounce_deadline) >= '0001-01-02 00:00:00+00'
                    AND greatest(available_at, deadline, debounce_deadline) <= '9999-12-30 00:00:00+00', true)
       AND coalesce(least(length(concurrency_key), length(dedup_key), length(debounce_key)) >= 1
                    AND greatest(length(concurrency_key), length(dedup_key), length(debounce_key)) <= 200, true)
       AND coalesce(jsonb_typeof(tags) = 'object', true) THEN
        RETURN true;
    END IF;
    -- As in a CHECK constraint, a rule that is NULL (a NULL column) holds.
    broken := CASE
        WHEN NOT coalesce(length(id) BETWEEN 1 AND 200, true) THEN 'workflow_executions_id_check'
        WHEN NOT coalesce(length(queue) BETWEEN 1 AND 100
                          AND ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = '',
                          true)
            THEN 'workflow_executions_queue_check'
        WHEN NOT coalesce(status IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled'), true)
            THEN 'workflow_executions_status_check'
        WHEN NOT coalesce((status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL), true)
            THEN 'workflow_executions_check'
        -- Time limits: a timeout of at most 10 years; stored times a client can load (the years 1 to 9999,
        -- with a day of margin for time zones). One bad row must never break the claim of its whole queue.
        WHEN NOT coalesce(timeout_seconds > 0 AND timeout_seconds <= 315360000, true)
            THEN 'workflow_executions_timeout_seconds_range'
        WHEN NOT coalesce(available_at BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_available_at_range'
        WHEN NOT coalesce(deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_deadline_range'
        WHEN NOT coalesce(debounce_deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00', true)
            THEN 'workflow_executions_debounce_deadline_range'
        WHEN NOT coalesce(length(concurrency_key) BETWEEN 1 AND 200, true)
            THEN 'workflow_executions_concurrency_key_check'
        WHEN NOT coalesce(length(dedup_key) BETWEEN 1 AND 200, true) THEN 'workflow_executions_dedup_key_check'
        WHEN NOT coalesce(length(debounce_key) BETWEEN 1 AND 200, true) THEN 'workflow_executions_debounce_key_check'
        WHEN NOT coalesce(jsonb_typeof(tags) = 'object', true) THEN 'workflow_executions_tags_object'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "workflow_executions" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'workflow_executions';
    END IF;
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION check_execution_row(text, text, text, text, timestamptz, double precision, timestamptz,
                                           timestamptz, text, text, text, timestamptz, jsonb) FROM PUBLIC;

-- One row per workflow execution. Kept narrow on purpose: the claim path updates status, owner and lease
-- many times per second, and a lower fillfactor leaves room for those updates to stay HOT. Every row is
-- updated several times (claim, heartbeats, waits, completion), so autovacuum is told to start early,
-- whatever the size of the history kept.
--
-- Life cycle: enqueued -> running -> succeeded | failed | cancelled, with 'waiting' in between for an
-- execution that holds no worker slot (a delayed start, a durable sleep, a receive, children).
CREATE TABLE workflow_executions (
    -- Caller-chosen ids are idempotency keys. Ids beginning with "sched:" are reserved for schedule ticks.
    id              text        PRIMARY KEY,
    name            text        NOT NULL,
    queue           text        NOT NULL DEFAULT 'default',
    status          text        NOT NULL DEFAULT 'enqueued',
    priority        integer     NOT NULL DEFAULT 0,
    -- Enqueue order, the tiebreaker after priority (many rows share one created_at: a bulk enqueue's
    -- transaction time).
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    -- Payloads are JSON: the workflow's keyword arguments, its result, its error ({"type", "message"...}).
    input           jsonb       NOT NULL DEFAULT '{}',
    output          jsonb,
    error           jsonb,
    -- Ownership is a lease on database time, renewed by heartbeats; an expired one is swept back to the
    -- queue.
    owner_id        text,
    lease_expires   timestamptz,
    -- The fencing token: incremented by every claim. A write made for attempt N succeeds only while the
    -- row still says N and is running, so a worker that lost its lease cannot write.
    attempt         integer     NOT NULL DEFAULT 0,
    -- How many times a lease expired while running (a crashed or stuck worker). Past max_recoveries the
    -- execution is dead-lettered (failed) instead of crashing yet another worker.
    recoveries      integer     NOT NULL DEFAULT 0,
    max_recoveries  integer     NOT NULL DEFAULT 5,
    -- When an enqueued execution may be claimed; when a waiting one wakes up (NULL: only when something it
    -- waits for happens).
    available_at    timestamptz DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    completed_at    timestamptz,
    -- What a waiting execution waits for: 'delay', 'sleep', 'recv:<topic>' or 'children'. Only a matching
    -- event wakes it early; its own available_at wakes it in any case.
    wait_reason     text,
    -- Bumped by everything that may satisfy a wait (a message sent to it, a child that finished). A worker
    -- suspends an execution only if this did not change since it looked for what it waits for, so a wake-up
    -- that lands in between is never lost.
    wakeups         bigint      NOT NULL DEFAULT 0,
    -- The execution that started this one as a child; cancellation cascades down this link and a finished
    -- child wakes its parent.
    parent_id       text,
    -- The execution this one was forked from, for lineage.
    forked_from     text,
    -- A time budget counted from the first start; the deadline is fixed then (or inherited from a parent,
    -- whichever is earlier). Past it the execution fails with pgdurable.WorkflowTimeout.
    timeout_seconds double precision,
    deadline        timestamptz,
    -- The application version that ran the execution last; workers of that version resume it, and so does a
    -- worker of another version that adopts (once no worker of this version is live, claim_with_policy_v2).
    app_version     text,
    -- Executions sharing a key are limited together by their queue's key_concurrency.
    concurrency_key text,
    -- While an execution with this key is unfinished in the queue, another with the same key is not
    -- enqueued (the enqueue returns the existing one, or is refused).
    dedup_key       text,
    -- The W3C trace context (traceparent, as a JSON object) of the code that enqueued it (tracing.py).
    trace_context   jsonb,
    -- Searchable labels: a JSON object of string values ({"customer": "42"}), given at enqueue and added
    -- to by pgdurable.set_tags; found by containment (tags @> ...) along workflow_executions_tags_idx.
    tags            jsonb,
    -- A debounced enqueue: while this execution has not started, enqueues of its workflow with the same key
    -- update it instead of creating another (workflow_executions_debounce_idx), pushing its start back,
    -- but never past debounce_deadline (the burst's first enqueue plus its maximum wait).
    debounce_key    text,
    debounce_deadline timestamptz,
    -- Why a parked execution (status 'waiting', wait_reason 'parked') waits: its recorded history does not
    -- replay on the code of the worker that claimed it (see "Versions and deploys" in docs/primitives.md).
    parked_reason   text,
    -- Ids, queue names and keys of bounded length, a known status, an owner and lease exactly while running,
    -- times and timeouts within limits: see check_execution_row above.
    CONSTRAINT workflow_executions_row_rules
        CHECK (check_execution_row(id, queue, status, owner_id, lease_expires, timeout_seconds, available_at, deadline,
                                   concurrency_key, dedup_key, debounce_key, debounce_deadline, tags))
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1,
    -- Vacuums always clean the indexes too (PostgreSQL 14+ skips that when few pages hold dead rows, as on a
    -- long history): a claimed execution's dead entry in the claim index lies ahead of all the queued work,
    -- where no insert cleans it up, and every claim steps over it until a vacuum's index pass removes it.
    vacuum_index_cleanup = on
);

-- The claim path: the most urgent, then oldest, enqueued executions of a queue. Partial, so finished and
-- waiting executions (however many) never slow a claim down.
CREATE INDEX workflow_executions_claim_idx
    ON workflow_executions (queue, priority, seq)
    WHERE status = 'enqueued';

-- The sweeper: running executions by lease expiry.
CREATE INDEX workflow_executions_lease_idx
    ON workflow_executions (lease_expires)
    WHERE status = 'running';

-- Listing and retention.
CREATE INDEX workflow_executions_created_idx ON workflow_executions (created_at);

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

-- Deduplication: one unfinished execution per (queue, dedup_key).
CREATE UNIQUE INDEX workflow_executions_dedup_idx
    ON workflow_executions (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('enqueued', 'waiting', 'running');

-- Per-key concurrency: the running executions of a key.
CREATE INDEX workflow_executions_key_running_idx
    ON workflow_executions (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'running';

-- Tags, searched by containment (list_workflows(tags=...); tags @> x implies tags IS NOT NULL, so the
-- planner uses this index). Partial: an execution without tags costs the index nothing.
CREATE INDEX workflow_executions_tags_idx
    ON workflow_executions USING gin (tags jsonb_path_ops)
    WHERE tags IS NOT NULL;

-- Debounce: one pending (not yet started) execution per workflow and debounce key. A claim sets
-- started_at, so a running execution leaves the index and the next enqueue starts a new burst.
CREATE UNIQUE INDEX workflow_executions_debounce_idx
    ON workflow_executions (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status IN ('enqueued', 'waiting');

-- == Steps =============================================================================================

-- One row per completed step of an execution: its recorded output or error. Written once (INSERT ... ON
-- CONFLICT DO NOTHING), only while the writer owns the execution's current attempt.
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

-- == Messages and events ===============================================================================

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

-- Streams an execution writes (pgdurable.write_stream): every value under a key, in order of the
-- write_stream step that wrote it (exactly once: the value and its step are one statement). A row with
-- closed = true (and no value) ends the key's stream (pgdurable.close_stream). Readers wait on NOTIFY.
CREATE TABLE workflow_streams (
    execution_id  text        NOT NULL,
    key           text        NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    step_id       integer     NOT NULL,
    value         jsonb,
    closed        boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, key, step_id),
    CHECK (closed = (value IS NULL))
) WITH (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);

-- == Queues and their policies =========================================================================

-- A queue's policy. A queue without a row (or with every limit NULL) has none: its claims take the
-- plain path, which never looks at this table.
CREATE TABLE queues (
    name                text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    -- At most this many executions of the queue run at once, across all workers.
    concurrency         integer     CHECK (concurrency > 0),
    -- At most this many run at once in any one worker process (the worker enforces it).
    worker_concurrency  integer     CHECK (worker_concurrency > 0),
    -- At most rate_limit starts per rate_period_seconds (a sliding window), across all workers.
    rate_limit          integer     CHECK (rate_limit > 0),
    rate_period_seconds double precision,
    -- At most this many running executions per concurrency_key (fairness between tenants).
    key_concurrency     integer     CHECK (key_concurrency > 0),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_seconds IS NULL)),
    CONSTRAINT queues_rate_period_seconds_range
        CHECK (rate_period_seconds > 0 AND rate_period_seconds <= 315360000)
);

-- Semaphores without a global lock: a queue with a concurrency limit N has N 'run' slots and a rate
-- limit R has R 'rate' slots. A claim takes free slots with SKIP LOCKED, so concurrent claimers take
-- different slots instead of queueing on one row. A run slot is free when its holder no longer runs
-- that attempt (finished, waiting, swept or re-claimed elsewhere): nothing has to release it. A rate
-- slot is free once its last use is a full period old. Updated on every claim: vacuumed early.
CREATE TABLE queue_slots (
    queue          text        NOT NULL REFERENCES queues (name) ON DELETE CASCADE,
    kind           text        NOT NULL CHECK (kind IN ('run', 'rate')),
    slot           integer     NOT NULL,
    holder_id      text,
    holder_attempt integer,
    used_at        timestamptz,
    PRIMARY KEY (queue, kind, slot)
) WITH (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 500);

-- == Workers ===========================================================================================

-- Live worker processes (heartbeats), so that work no live worker can run is visible.
CREATE TABLE workers (
    id              text        PRIMARY KEY,
    hostname        text        NOT NULL,
    pid             integer     NOT NULL,
    queues          text[]      NOT NULL,
    workflows       text[]      NOT NULL,
    concurrency     integer     NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    app_version     text,
    -- How long a version must have no live worker before this worker adopts its executions (NULL: it
    -- never does: strict, per-version mode).
    adopt_after_seconds double precision,
    -- The worker's lease (it heartbeats every third of one); NULL for workers older than version 16.
    lease_seconds   double precision CHECK (lease_seconds > 0)
);

-- A worker is live while its last heartbeat is younger than two of its leases (two minutes when unknown).
CREATE FUNCTION worker_alive(heartbeat_at timestamptz, lease_seconds double precision) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT heartbeat_at > now() - make_interval(secs => least(2 * coalesce(lease_seconds, 60), 86400))
$$;
REVOKE ALL ON FUNCTION worker_alive(timestamptz, double precision) FROM PUBLIC;  -- workers' (and owners') only

-- Executions that no live worker will run: enqueued ones that nobody serves, whose workflow the workers
-- of their queue do not know, or whose application version no live worker runs nor adopts; and parked
-- ones (their history does not replay on the code that claimed them).
CREATE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN e.status = 'waiting'
            THEN 'parked: ' || coalesce(e.parked_reason, 'its history does not replay on the code that claimed it')
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker serves queue ' || e.queue
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                               AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
            ELSE 'no live worker runs application version ' || e.app_version || ' or adopts other versions'
       END AS reason
FROM workflow_executions e
WHERE (e.status = 'enqueued'
       AND NOT EXISTS (SELECT 1 FROM workers w
                       WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                         AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version
                              OR w.adopt_after_seconds IS NOT NULL)
                         AND worker_alive(w.heartbeat_at, w.lease_seconds)))
   OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL);

-- == Schedules =========================================================================================

-- Cron schedules. Every worker fires due schedules: it locks them (FOR UPDATE SKIP LOCKED), enqueues one
-- execution per due tick with a deterministic id ("sched:<name>:<tick>"), and advances next_fire_at, all
-- in one transaction, so each tick fires once.
CREATE TABLE schedules (
    name              text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    workflow_name     text        NOT NULL CHECK (length(workflow_name) BETWEEN 1 AND 200),
    -- 5 fields, 6 with seconds first, or @hourly/@daily/...; validated by pgdurable when written through its
    -- API. A row edited by hand into something invalid is paused by the first worker that meets it.
    cron              text        NOT NULL,
    -- An IANA zone name: the cron's wall-clock times are read in it (daylight saving time included).
    timezone          text        NOT NULL DEFAULT 'UTC',
    queue             text        NOT NULL DEFAULT 'default' CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    priority          integer     NOT NULL DEFAULT 0,
    max_recoveries    integer     NOT NULL DEFAULT 5 CHECK (max_recoveries >= 0),
    -- The workflow's keyword arguments.
    args              jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
    -- Also pass the tick's time (UTC, ISO 8601) as the keyword argument scheduled_at.
    pass_scheduled_at boolean     NOT NULL DEFAULT false,
    -- After downtime: 'skip' fires only the missed ticks late by less than the misfire grace (60 s),
    -- 'all' fires every missed tick.
    catch_up          text        NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('skip', 'all')),
    paused            boolean     NOT NULL DEFAULT false,
    -- The earliest instant whose tick has not fired yet: due ticks are those in [next_fire_at, now()].
    -- NULL: the next worker to look sets it to the first tick after its now() (handy for rows inserted by
    -- hand).
    next_fire_at      timestamptz,
    last_fired_at     timestamptz,
    -- Why a worker paused this schedule (its row was invalid); cleared when it is resumed or redefined.
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- When the definition last changed (firing does not count).
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- The ticks' time budget, like every other way of creating an execution.
    timeout_seconds   double precision CHECK (timeout_seconds > 0 AND timeout_seconds <= 315360000)
);

-- The firing query and the workers' wake-up time: active schedules by next fire time (unset ones first).
CREATE INDEX schedules_due_idx ON schedules (next_fire_at NULLS FIRST) WHERE NOT paused;

-- == Notifications =====================================================================================
-- Workers sleep on LISTEN and are woken by NOTIFY; polling is only the fallback. The SQL side (the one
-- insert path, insert_executions_v2, and triggers on status changes), not the client, sends these, so that
-- every writer, in any language, wakes the sleepers; NOTIFY is delivered on commit and
-- identical payloads within a transaction are folded into one. The channels are "<schema>_<kind>" (kinds:
-- work, done, result, stop, event, schedules), named by notify_channel() here and by channels.py in Python.

-- Executions someone waits for the outcome of (a result wait outside workflows registers its execution
-- before it sleeps): their completion alone sends a NOTIFY ("_result" with the outcome, or "_done" with the
-- id), so finishing work nobody waits for does not serialise the workers' commits. A registration and a
-- completion of the same execution are ordered by an advisory lock on one of 1,024 buckets of the id's hash
-- (key: 'awaited_executions'::regclass::oid::integer, hashtext(execution_id) & 1023), held exclusively by the
-- registration (await_execution_v2) and shared by the completion's trigger: either the wait sees the finished
-- status, or the completion, which deletes the row, sees the registration. Buckets bound the locks a bulk
-- completion holds; sharing keeps completions from waiting for each other. (Not a row lock: PostgreSQL can
-- lose a FOR KEY SHARE taken while an UPDATE moves the row to another page; migration 0028 says how.)
CREATE TABLE awaited_executions (
    execution_id text        NOT NULL,
    since        timestamptz NOT NULL DEFAULT now(),
    -- Whether the completion's notification carries the outcome ("_result") rather than the id ("_done").
    carry_result boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (execution_id, carry_result)
);

-- The name of the channel of a kind, for this schema (Python: channels.channel(schema, kind)).
CREATE FUNCTION notify_channel(kind text) RETURNS text
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

-- Doorbells: PostgreSQL serialises the commits of notifying transactions (one lock, held through the
-- commit's WAL flush), so wake-ups must not ride on every enqueue of an application's transactions. A
-- worker arms a bell per queue when it is about to sleep (worker/producer.py); an enqueue notifies only if
-- it disarms an armed bell: one NOTIFY per worker's sleep, none while the workers are busy (they claim
-- again without being told). A transaction that checked the bell just before a worker armed it, and
-- committed after that worker's last claim, wakes nobody: the sleeping worker re-claims on a backoff that
-- starts at 50 ms, so such work waits about as long as its transaction was open.
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

-- Status changes: wake workers for enqueued work, wake result waiters for finished executions ("_done",
-- payload the id), tell the owner of a running execution that was cancelled or timed out to stop at once
-- ("_stop"), and wake a parent waiting on a child that finished.
CREATE FUNCTION notify_execution_change() RETURNS trigger
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

-- The status of an execution about to be waited for, registering an unfinished one as awaited (its
-- completion then notifies); one round trip. A finished one is only read. For an unfinished one the wait
-- takes the registration lock of the id's bucket (exclusively; a completing execution holds it shared from
-- its trigger until it commits), then reads again in a statement of its own, which sees a completion that
-- committed while the lock waited for it. Either the wait sees the finished status, or the completion,
-- waiting for the registration's lock, sees the registration. With carry_result, the completion's
-- notification carries the outcome ("_result"); without, it carries the id ("_done"). seen: the snapshot of
-- the look that found it unfinished. A "_result" notification names the transaction that sent it: one
-- visible in seen finished an earlier run (before a resume), and its outcome is not this wait's.
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

-- The previous release's registration: notified on "_done" with the id.
CREATE FUNCTION await_execution_v1(awaited_id text)
RETURNS TABLE (status text, output jsonb, error jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT a.status, a.output, a.error FROM await_execution_v2(awaited_id, false) AS a;
END;
$$;

-- A published event wakes its readers ("_event", payload the execution id).
CREATE FUNCTION notify_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(notify_channel('event'), NEW.execution_id);
    RETURN NULL;
END;
$$;

-- Wake the workers' firing loops when a schedule may have become due sooner than they planned (a new one,
-- a resumed one, an earlier next_fire_at); firing only moves next_fire_at later, so it does not notify.
CREATE FUNCTION notify_schedule_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(notify_channel('schedules'), '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER workflow_executions_notify_update
    AFTER UPDATE OF status ON workflow_executions
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_execution_change();

-- An enqueued execution whose row another transaction held while a worker claimed (a send bumping its
-- wake-up count, a child finishing) was passed over by that claim (SKIP LOCKED): wake the workers again.
CREATE TRIGGER workflow_executions_notify_touched
    AFTER UPDATE OF wakeups ON workflow_executions
    FOR EACH ROW WHEN (OLD.status = 'enqueued' AND NEW.status = 'enqueued')
    EXECUTE FUNCTION notify_execution_change();

CREATE TRIGGER workflow_events_notify
    AFTER INSERT ON workflow_events
    FOR EACH ROW EXECUTE FUNCTION notify_event();

-- A stream value (or its close) wakes its readers on the same channel as events.
CREATE TRIGGER workflow_streams_notify
    AFTER INSERT ON workflow_streams
    FOR EACH ROW EXECUTE FUNCTION notify_event();

CREATE TRIGGER schedules_notify_insert
    AFTER INSERT ON schedules
    FOR EACH ROW WHEN (NOT NEW.paused)
    EXECUTE FUNCTION notify_schedule_change();

CREATE TRIGGER schedules_notify_update
    AFTER UPDATE ON schedules
    FOR EACH ROW WHEN (NOT NEW.paused AND (OLD.paused OR NEW.next_fire_at IS NULL
                                           OR NEW.next_fire_at < OLD.next_fire_at))
    EXECUTE FUNCTION notify_schedule_change();

-- == The clock =========================================================================================

-- Two clocks. Durable time (clock_now()) is what workflows and schedules wait on: timers, delayed starts,
-- deadlines, cron ticks, retention, and the times recorded for executions, steps, messages and events.
-- Liveness time (now()) is what proves a process alive: leases, heartbeats, the worker registry, and
-- rate-limit windows (a limit protects a real service, whose time does not skip). Both are the database's
-- time in production. Only durable time can be moved by tests, and it must be, on its own: a clock that
-- jumped ahead under leases would expire every live lease and hand running executions to a second owner.
--
-- The time-skipping test clock (pgdurable.testing): durable time runs test_clock.ahead ahead of now(), in
-- every session of the schema (the workers' pools, a caller's own transaction calling enqueue_workflow).
-- The harness only ever adds to it, so durable time never goes back. The one row is read only when
-- clock_now() runs with pgdurable.test_clock = 'on', which only the harness sets, on the function itself
-- (ALTER FUNCTION clock_now() SET pgdurable.test_clock = 'on'): production reads one missing setting.
CREATE TABLE test_clock (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    ahead     interval NOT NULL DEFAULT '0' CHECK (ahead >= interval '0')
);
INSERT INTO test_clock DEFAULT VALUES;

-- The test clock's reading: now() + test_clock.ahead (clock_now() calls it on a time-skipping test schema).
CREATE FUNCTION test_clock_now() RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN pg_catalog.now() + (SELECT c.ahead FROM test_clock c);
END;
$$;
REVOKE ALL ON FUNCTION test_clock_now() FROM PUBLIC;

-- Durable time: now(); or pgdurable.fake_now when a session sets it (SQL tests: SET pgdurable.fake_now =
-- '2030-01-01 00:00+00' moves time without sleeping); or test_clock_now() on a time-skipping test schema.
-- A SQL function with a standard body and no SET clause, so that PostgreSQL inlines it into every statement
-- that calls it (two settings read and now(), no call at all): the PL/pgSQL version's call (its SET clause
-- switching the search_path there and back, its set-up in every transaction) cost each step checkpoint about
-- 18 microseconds of server time (docs/benchmarks.md, "Durable time inlined"). The one exception to rule 3:
-- a standard body's names are bound when the function is created, so no caller's search_path can redirect
-- them. On a test schema the harness's SET clause (pgdurable.test_clock = 'on') stops the inlining: only tests
-- pay for a call.
CREATE FUNCTION clock_now() RETURNS timestamptz
LANGUAGE sql
STABLE
RETURN CASE
    WHEN pg_catalog.current_setting('pgdurable.fake_now', true) <> ''
        THEN pg_catalog.current_setting('pgdurable.fake_now', true)::pg_catalog.timestamptz
    WHEN pg_catalog.current_setting('pgdurable.test_clock', true) = 'on' THEN test_clock_now()
    ELSE pg_catalog.now()
END;

-- == Creating executions: the one insert path ==========================================================

-- Every way of creating an execution (enqueue, enqueue_many, App.start, a child, a fork, a schedule tick,
-- enqueue_workflow, a table binding's trigger) inserts through insert_executions_v2 (the trigger through
-- _v1, which calls it), so the values derived at creation are decided in one place. Two exceptions, for
-- the single enqueue every application makes most, each a plain INSERT of the row that function writes for
-- the same options (tests/test_enqueue_rows.py holds them to it): app.enqueue's named query `enqueue`, and
-- insert_execution_v1 below, enqueue_workflow's.

-- One execution to create, as insert_executions_v2 reads it from JSON (by field name; absent fields are
-- NULL, then the function's defaults apply). Fields: those of execution_spec_v1 below, then tags,
-- debounce_key, debounce_seconds and debounce_max_seconds.
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

-- The insert of the previous release, for its workers during a deploy (and for table_binding_fire): the same
-- as v2. PL/pgSQL, not SQL: a pinned SQL function is planned again by every statement that calls it.
CREATE FUNCTION insert_executions_v1(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM insert_executions_v2(rows, common, raise_on_conflict);
END;
$$;

-- One execution as the previous release's insert read it (kept while insert_executions_v1 is).
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

-- == The SQL API (any language, inside the caller's transaction) =======================================

-- The id of a new execution when its creator gives none: a UUIDv7 (RFC 9562) as text, whose first 48 bits
-- are the Unix time in milliseconds (the wall clock's: this is no durable time, only an order). New
-- executions so land together on the right edge of the primary key (and of operation_outputs's), not on
-- random pages of a long history (see src/pgdurable/ids.py, which makes the same ids in Python).
CREATE FUNCTION new_execution_id() RETURNS text
LANGUAGE plpgsql  -- not SQL: a pinned SQL function is planned again by every statement that calls it
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    r bytea := uuid_send(gen_random_uuid());  -- its variant bits are already RFC 9562's
BEGIN
    -- the first 48 bits: the Unix time in milliseconds
    r := overlay(r PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                 FROM 1 FOR 6);
    RETURN encode(set_byte(r, 6, get_byte(r, 6) & 15 | 112), 'hex')::uuid::text;  -- the version nibble: 7
END;
$$;
REVOKE ALL ON FUNCTION new_execution_id() FROM PUBLIC;

-- The execution enqueue_workflow creates (not debounced), with one plain INSERT: the row insert_executions_v2
-- writes for the same options. Its JSON round trip, table function and batch steps cost one call about 110 us
-- of backend CPU (docs/benchmarks.md, "Enqueue through SQL: one INSERT"). True if it created the row; false if
-- the id is taken or an unfinished execution of the queue holds the dedup key. Rings the queue's bells for a
-- row claimable now; a delayed one rings when the timer's UPDATE makes it due (notify_execution_change). The
-- Citus layout replaces it with a call of its own insert_executions_v2, which routes the row to its bucket.
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

-- Enqueue a workflow inside the caller's transaction: it exists if and only if that transaction commits,
-- and workers are woken (NOTIFY) at commit. A given workflow_id is an idempotency key: enqueuing it again
-- returns the same id. Arguments go by name in a JSON object: '{"order_id": 42}'. A delayed start waits
-- in 'waiting' (out of the claim index) until the timer enqueues it. With a dedup_key that an unfinished
-- execution of the queue already has, returns that execution's id instead of a new one. Refuses (SQLSTATE
-- 22023) every value outside the limits, and ids in the reserved "sched:" namespace. tags: a JSON object
-- of string values. debounce_key (with debounce_seconds, optionally debounce_max_seconds): while an
-- execution of this workflow with this key has not started, update it (arguments, tags, a start
-- debounce_seconds from now, never past its first enqueue plus debounce_max_seconds) and return its id.
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

-- The status and result of one execution; no row if there is none with this id.
CREATE FUNCTION workflow_status(workflow_id text)
RETURNS TABLE (status text, output jsonb, error jsonb, attempt integer, created_at timestamptz,
               completed_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT e.status, e.output, e.error, e.attempt, e.created_at, e.completed_at
    FROM workflow_executions e WHERE e.id = workflow_id;
$$;

-- Cancel an execution and, down the parent links, every unfinished descendant; true if the execution
-- itself was cancelled. A running one stops at once (its owner is notified) and writes nothing more.
CREATE FUNCTION cancel_workflow(workflow_id text) RETURNS boolean
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
            completed_at = clock_now(), updated_at = clock_now()
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
        available_at = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN clock_now()
                            ELSE e.available_at END
    WHERE e.id = destination_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send_message: no workflow execution has id %', quote_nullable(destination_id)
            USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO workflow_messages (destination_id, topic, message, idempotency_key, created_at)
    VALUES (destination_id, topic, message, idempotency_key, clock_now())
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

-- A transactional step's checkpoint, written in the step's own transaction just before it commits: true
-- if written, false if the writer no longer owns the execution's current attempt (then the caller rolls
-- the whole transaction back). Runs with the caller's rights (the worker's role).
CREATE FUNCTION checkpoint_step(execution_id text, attempt integer, step_id integer, step_name text,
                                output jsonb, error jsonb, attempts integer, started_at timestamptz)
RETURNS boolean
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH owned AS (
        SELECT e.id FROM workflow_executions e
        WHERE e.id = checkpoint_step.execution_id AND e.attempt = checkpoint_step.attempt
          AND e.status = 'running' AND e.lease_expires > now()
        FOR SHARE
    ), written AS (
        INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                       recorded_by_attempt, started_at, completed_at)
        SELECT owned.id, checkpoint_step.step_id, checkpoint_step.step_name, checkpoint_step.output,
               checkpoint_step.error, checkpoint_step.attempts, checkpoint_step.attempt,
               checkpoint_step.started_at, clock_now()
        FROM owned
        ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) > 0 FROM written;
$$;

-- == Queue policies and the policy claim ===============================================================
-- (The plain claim, without a policy, is the named query "claim" in queries/executions.sql.)

-- Create, change or remove (all limits NULL) a queue's policy, keeping its slots in step.
CREATE FUNCTION set_queue_policy(queue_name text, concurrency integer, worker_concurrency integer,
                                 rate_limit integer, rate_period_seconds double precision,
                                 key_concurrency integer) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO queues AS q (name, concurrency, worker_concurrency, rate_limit, rate_period_seconds,
                             key_concurrency)
    VALUES (queue_name, concurrency, worker_concurrency, rate_limit, rate_period_seconds, key_concurrency)
    ON CONFLICT (name) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency,
        rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        key_concurrency = EXCLUDED.key_concurrency, updated_at = now();
    DELETE FROM queue_slots s
    WHERE s.queue = queue_name
      AND ((s.kind = 'run' AND s.slot > coalesce(set_queue_policy.concurrency, 0))
        OR (s.kind = 'rate' AND s.slot > coalesce(set_queue_policy.rate_limit, 0)));
    INSERT INTO queue_slots (queue, kind, slot)
    SELECT queue_name, 'run', i FROM generate_series(1, coalesce(set_queue_policy.concurrency, 0)) AS i
    UNION ALL
    SELECT queue_name, 'rate', i FROM generate_series(1, coalesce(set_queue_policy.rate_limit, 0)) AS i
    ON CONFLICT DO NOTHING;
    IF concurrency IS NULL AND worker_concurrency IS NULL AND rate_limit IS NULL AND key_concurrency IS NULL THEN
        DELETE FROM queues WHERE name = queue_name;
    END IF;
END;
$$;


-- The claim of a queue with a policy (workers of version 14 on): like the plain claim, but takes at most
-- as many executions as it got free run slots and rate slots, and skips executions whose concurrency key is at its limit. No row
-- can make it raise: the timeout and the rate period are clamped to 10 years (the constraints hold them
-- there too), because one bad row here would stop its whole queue. Availability, deadlines, the times
-- stamped and returned are durable time (clock_now(), read once); the lease and the rate window are not.
-- adopt_after (seconds, NULL: never) lets it take executions of versions with no live worker (adoption),
-- and previous_version says which version each claimed execution had. Its walk locks FOR NO KEY UPDATE, as
-- the plain claim does (the lock its update takes anyway).
CREATE FUNCTION claim_with_policy_v2(queue_name text, names text[], owner text, lease double precision,
                                     max_claims integer, version text, adopt_after double precision)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean,
               previous_version text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    policy queues%ROWTYPE;
    run_slots integer[];
    rate_slots integer[];
    wanted integer := max_claims;
    chosen text[] := '{}';
    chosen_versions text[] := '{}';
    chosen_keys text[] := '{}';
    candidate record;
    running_for_key integer;
    scanned integer := 0;
    at timestamptz := clock_now();
BEGIN
    SELECT * INTO policy FROM queues q WHERE q.name = queue_name;
    IF policy.concurrency IS NOT NULL THEN
        SELECT array_agg(s.slot) INTO run_slots FROM (
            SELECT s.slot FROM queue_slots s
            LEFT JOIN workflow_executions e ON e.id = s.holder_id
            WHERE s.queue = queue_name AND s.kind = 'run'
              AND (s.holder_id IS NULL OR e.id IS NULL OR e.status <> 'running' OR e.attempt <> s.holder_attempt)
            ORDER BY s.slot
            LIMIT wanted
            FOR UPDATE OF s SKIP LOCKED) s;
        -- A slot locked above may have been taken by a claim that committed after this statement's snapshot
        -- and before the lock: FOR UPDATE re-read the slot's new holder but judged it against the execution
        -- row of the old snapshot (the join no longer matched, so it looked free). With the locks held, look
        -- again in a new statement, which sees every claim committed before them.
        SELECT array_agg(s.slot ORDER BY s.slot) INTO run_slots
        FROM queue_slots s
        LEFT JOIN workflow_executions e ON e.id = s.holder_id
        WHERE s.queue = queue_name AND s.kind = 'run' AND s.slot = ANY (run_slots)
          AND (s.holder_id IS NULL OR e.id IS NULL OR e.status <> 'running' OR e.attempt <> s.holder_attempt);
        wanted := least(wanted, coalesce(cardinality(run_slots), 0));
    END IF;
    IF policy.rate_limit IS NOT NULL AND wanted > 0 THEN
        SELECT array_agg(s.slot) INTO rate_slots FROM (
            SELECT s.slot FROM queue_slots s
            WHERE s.queue = queue_name AND s.kind = 'rate'
              AND (s.used_at IS NULL
                   OR s.used_at <= now() - make_interval(secs => least(policy.rate_period_seconds, 315360000)))
            ORDER BY s.slot
            LIMIT wanted
            FOR UPDATE OF s SKIP LOCKED) s;
        wanted := least(wanted, coalesce(cardinality(rate_slots), 0));
    END IF;
    IF wanted <= 0 THEN
        RETURN;
    END IF;

    -- Walk the queue in claim order. Keyed executions are taken only while their key has room: the key's
    -- advisory lock (held to the end of this transaction) makes concurrent claimers of one key take turns,
    -- and the count below runs after it is held, so it sees every claim of the key committed before. The
    -- walk is bounded, so one busy key at the head of a long queue cannot make claims slow. Executions of
    -- a version with a live worker are left to it (adoption).
    FOR candidate IN
        SELECT e.id, e.concurrency_key, e.app_version FROM workflow_executions e
        WHERE e.status = 'enqueued' AND e.queue = queue_name AND e.name = ANY (names)
          AND e.available_at <= at
          AND (e.app_version IS NULL OR e.app_version = version
               OR (adopt_after IS NOT NULL
                   AND e.app_version NOT IN (SELECT w.app_version FROM workers w
                                             WHERE w.app_version IS NOT NULL
                                               AND w.heartbeat_at > now() - make_interval(secs => adopt_after))))
        ORDER BY e.priority, e.seq
        FOR NO KEY UPDATE OF e SKIP LOCKED
    LOOP
        scanned := scanned + 1;
        EXIT WHEN scanned > 1000;
        IF candidate.concurrency_key IS NOT NULL AND policy.key_concurrency IS NOT NULL THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended(queue_name || ':' || candidate.concurrency_key, 7231));
            SELECT count(*) INTO running_for_key FROM workflow_executions e
            WHERE e.queue = queue_name AND e.concurrency_key = candidate.concurrency_key AND e.status = 'running';
            running_for_key := running_for_key
                + (SELECT count(*) FROM unnest(chosen_keys) k WHERE k = candidate.concurrency_key);
            CONTINUE WHEN running_for_key >= policy.key_concurrency;
            chosen_keys := chosen_keys || candidate.concurrency_key;
        END IF;
        chosen := chosen || candidate.id;
        chosen_versions := chosen_versions || candidate.app_version;
        EXIT WHEN cardinality(chosen) >= wanted;
    END LOOP;

    RETURN QUERY
    WITH claimed AS (
        UPDATE workflow_executions e
        SET status = 'running',
            owner_id = owner,
            lease_expires = now() + make_interval(secs => lease),
            attempt = e.attempt + 1,
            -- The moment of the claim itself (not the transaction's start, before the slots and key
            -- locks were taken), so that limits can be checked against these timestamps; on durable time.
            started_at = coalesce(e.started_at, clock_timestamp() + (at - now())),
            updated_at = at,
            app_version = version,
            deadline = CASE WHEN e.timeout_seconds IS NOT NULL AND (e.deadline IS NULL OR e.started_at IS NULL)
                            THEN least(coalesce(e.deadline, 'infinity'),
                                       at + make_interval(secs => least(e.timeout_seconds, 315360000)))
                            ELSE e.deadline END
        WHERE e.id = ANY (chosen)
        RETURNING e.id, e.name, e.attempt, e.input, e.forked_from, e.seq, e.priority
    ), numbered AS (
        SELECT c.*, row_number() OVER (ORDER BY c.priority, c.seq) AS n FROM claimed c
    ), held AS (
        UPDATE queue_slots s
        SET holder_id = numbered.id, holder_attempt = numbered.attempt
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'run' AND s.slot = run_slots[numbered.n]
    ), used AS (
        UPDATE queue_slots s
        SET used_at = clock_timestamp()
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'rate' AND s.slot = rate_slots[numbered.n]
    )
    SELECT numbered.id, numbered.name, numbered.attempt, numbered.input, at,
           numbered.attempt > 1 OR numbered.forked_from IS NOT NULL,
           chosen_versions[array_position(chosen, numbered.id)]
    FROM numbered;
END;
$$;

-- The previous release's policy claim, for its workers during a rolling deploy: claim_with_policy_v2 in
-- strict mode (no adoption), without previous_version. One body for both.
CREATE FUNCTION claim_with_policy(queue_name text, names text[], owner text, lease double precision,
                                             max_claims integer, version text)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT c.id, c.name, c.attempt, c.input, c.db_now, c.has_history
    FROM claim_with_policy_v2(queue_name, names, owner, lease, max_claims, version, NULL) AS c;
$$;

-- == Table bindings ====================================================================================
-- A table bound to a workflow (bind_table): a trigger on the application's table enqueues the workflow for
-- every matching row change, inside the writing transaction, with the row's columns as its arguments by
-- name (docs/table-bound-workflows.md). The trigger is the binding; table_bindings records each one so
-- that it can be listed, checked and re-created.

-- One row per binding.
CREATE TABLE table_bindings (
    -- The binding's name: the trigger is "pgdurable:<name>" and the executions' ids begin "bind:<name>:".
    name            text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,50}$'),
    -- The table, schema-qualified, as it was named when bound (a later rename does not update it; the
    -- trigger follows the table).
    relation        text        NOT NULL,
    workflow_name   text        NOT NULL CHECK (length(workflow_name) BETWEEN 1 AND 200),
    -- Which changes fire it: a non-empty subset of insert, update, delete.
    operations      text[]      NOT NULL,
    -- The trigger's WHEN clause (a boolean SQL expression on NEW and OLD), if any.
    when_condition  text,
    -- The primary key's columns, in key order: with the transaction, they identify a change.
    key_columns     text[]      NOT NULL,
    -- The columns passed as arguments (NULL: every column).
    columns         text[],
    -- Also pass the row before the change as the argument "old" (NULL for an insert).
    pass_old        boolean     NOT NULL DEFAULT false,
    queue           text        NOT NULL DEFAULT 'default' CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    priority        integer     NOT NULL DEFAULT 0,
    max_recoveries  integer     NOT NULL DEFAULT 5 CHECK (max_recoveries >= 0),
    timeout_seconds double precision CHECK (timeout_seconds > 0 AND timeout_seconds <= 315360000),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The trigger function of every binding. Its one argument is the binding as JSON (name, key, columns,
-- pass_old, and "common": the execution's workflow name, queue, priority, max_recoveries, timeout), so
-- firing reads no table. SECURITY DEFINER (owned by the engine's owner): the role that writes the bound
-- table needs no rights on the engine's tables. Nobody but the engine's owner and worker roles may attach
-- it to a table (EXECUTE is revoked from PUBLIC; PostgreSQL checks it when a trigger is created).
--
-- A change is identified by the binding, the row's primary key, the operation and the transaction (its id
-- and start time: an id alone repeats after a dump and restore into a new cluster). That makes the
-- execution id deterministic: a trigger that fires again for the same change finds its execution already
-- there. A row changed again by the same operation in the same transaction is the same change: its
-- execution, still uncommitted and unclaimed, gets the row's latest version (and keeps, as "old", the row
-- as it was before the transaction's first change).
CREATE FUNCTION table_binding_fire() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    binding constant jsonb := TG_ARGV[0]::jsonb;
    changed jsonb;
    arguments jsonb;
    key_text text;
    change text;
    new_id text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        changed := to_jsonb(OLD);
    ELSE
        changed := to_jsonb(NEW);
    END IF;
    IF jsonb_typeof(binding -> 'columns') = 'array' THEN
        SELECT coalesce(jsonb_object_agg(c.name, changed -> c.name), '{}') INTO arguments
        FROM jsonb_array_elements_text(binding -> 'columns') AS c(name)
        WHERE changed ? c.name;
    ELSE
        arguments := changed;
    END IF;
    IF (binding ->> 'pass_old')::boolean THEN
        arguments := arguments || jsonb_build_object('old', to_jsonb(OLD));
    END IF;
    SELECT jsonb_agg(changed -> k.name ORDER BY k.n)::text INTO key_text
    FROM jsonb_array_elements_text(binding -> 'key') WITH ORDINALITY AS k(name, n);
    change := lower(left(TG_OP, 1)) || ':' || pg_current_xact_id()::text || '.'
              || floor(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint::text;
    new_id := format('bind:%s:%s:%s', binding ->> 'name', key_text, change);
    IF length(new_id) > 200 THEN
        new_id := format('bind:%s:md5=%s:%s', binding ->> 'name', md5(key_text), change);
    END IF;
    -- Only the fields a binding sets, whoever created the trigger and with whatever argument.
    PERFORM FROM insert_executions_v1(
        jsonb_build_array(jsonb_build_object('id', new_id, 'input', arguments)),
        jsonb_build_object('name', binding -> 'common' -> 'name', 'queue', binding -> 'common' -> 'queue',
                           'priority', binding -> 'common' -> 'priority',
                           'max_recoveries', binding -> 'common' -> 'max_recoveries',
                           'timeout_seconds', binding -> 'common' -> 'timeout_seconds'));
    IF NOT FOUND THEN
        -- The same change again: the latest row, and (with pass_old) the row as it was before the change.
        UPDATE workflow_executions e
        SET input = CASE WHEN (binding ->> 'pass_old')::boolean
                         THEN arguments || jsonb_build_object('old', e.input -> 'old') ELSE arguments END,
            updated_at = now()
        WHERE e.id = new_id AND e.status = 'enqueued' AND e.attempt = 0;
    END IF;
    RETURN NULL;
END;
$$;

-- Bind a table to a workflow: from now on (in this transaction, if it commits), every change of a row of
-- ``target`` by one of ``operations`` for which ``when_condition`` holds enqueues ``workflow_name`` with
-- the row's ``columns`` (all if NULL) as its arguments by name. Binding again under the same name replaces
-- the binding (its trigger is re-created). Runs with the caller's rights: the caller needs the TRIGGER
-- privilege on the table (its owner has it) and to be the engine's owner or a worker role. Returns the
-- binding's name (by default "<table>:<workflow>", characters outside [A-Za-z0-9_.:-] made "_").
--
-- ``when_condition`` is SQL written by the developer, like a migration (never pass end users' input): it
-- becomes the trigger's WHEN clause, which PostgreSQL parses and type-checks as one boolean expression.
CREATE FUNCTION bind_table(
    target          regclass,
    workflow_name   text,
    operations      text[]           DEFAULT '{insert}',
    when_condition  text             DEFAULT NULL,
    binding_name    text             DEFAULT NULL,
    columns         text[]           DEFAULT NULL,
    pass_old        boolean          DEFAULT false,
    queue           text             DEFAULT 'default',
    priority        integer          DEFAULT 0,
    max_recoveries  integer          DEFAULT 5,
    timeout_seconds double precision DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    fire constant regprocedure := to_regprocedure('table_binding_fire()');
    relation_kind "char";
    qualified text;
    key_columns text[];
    unknown text[];
    ops text[];
    binding text;
    trigger_name text;
    existing record;
    config jsonb;
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'bind_table: target must name a table' USING ERRCODE = '22023';
    END IF;
    SELECT c.relkind, format('%I.%I', n.nspname, c.relname) INTO relation_kind, qualified
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target;
    IF relation_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'bind_table: % is not a table', target USING ERRCODE = '42809';
    END IF;
    -- pgdurable's own tables: an execution's insert would fire the trigger that inserts it, and so on.
    IF (SELECT c.relnamespace FROM pg_class c WHERE c.oid = target) = current_schema()::regnamespace THEN
        RAISE EXCEPTION 'bind_table: % is one of pgdurable''s own tables', target USING ERRCODE = '42809';
    END IF;
    IF workflow_name IS NULL OR length(workflow_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'bind_table: workflow_name must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'bind_table: queue % is not a valid queue name', quote_nullable(queue)
            USING ERRCODE = '22023', HINT = '1 to 100 letters, digits, or _ . : -';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'bind_table: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT (timeout_seconds > 0 AND timeout_seconds <= 315360000) THEN
        RAISE EXCEPTION 'bind_table: timeout_seconds % must be a finite number of seconds, > 0 and <= '
                        '315360000 (10 years)', timeout_seconds
            USING ERRCODE = '22023';
    END IF;

    -- The primary key identifies the row of a change.
    SELECT array_agg(a.attname::text ORDER BY k.n) INTO key_columns
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = target AND i.indisprimary;
    IF key_columns IS NULL THEN
        RAISE EXCEPTION 'bind_table: table % has no primary key', target
            USING ERRCODE = '55000',
                  HINT = 'a binding identifies each change by the row''s primary key (it makes the execution '
                         'id deterministic); add one';
    END IF;

    SELECT array_agg(DISTINCT lower(o)) INTO ops FROM unnest(operations) AS o;
    IF ops IS NULL OR NOT ops <@ ARRAY['insert', 'update', 'delete'] THEN
        RAISE EXCEPTION 'bind_table: operations must be a non-empty list of insert, update, delete, not %',
                        coalesce(operations::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;

    IF columns IS NOT NULL THEN
        SELECT array_agg(c) INTO unknown FROM unnest(columns) AS c
        WHERE c IS NULL OR NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = target AND a.attname = c
                                                                    AND a.attnum > 0 AND NOT a.attisdropped);
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'bind_table: table % has no column(s) %', target, unknown USING ERRCODE = '42703';
        END IF;
    END IF;
    IF pass_old AND (CASE WHEN columns IS NULL
                          THEN EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = target AND a.attname = 'old'
                                                                  AND a.attnum > 0 AND NOT a.attisdropped)
                          ELSE 'old' = ANY (columns) END) THEN
        RAISE EXCEPTION 'bind_table: table % has a column "old", which pass_old would overwrite', target
            USING ERRCODE = '22023', HINT = 'pass the columns without "old", or do not pass the old row';
    END IF;

    -- A cheap guard against a WHEN clause that smuggles in a second statement. The clause is also set on
    -- lines of its own, so a trailing comment cannot swallow the rest of the statement, and the trigger
    -- is checked below to run table_binding_fire.
    IF position(';' IN coalesce(when_condition, '')) > 0 THEN
        RAISE EXCEPTION 'bind_table: the when condition must be one SQL expression, without ";"'
            USING ERRCODE = '42601';
    END IF;
    IF when_condition IS NOT NULL AND btrim(when_condition) = '' THEN
        when_condition := NULL;
    END IF;

    binding := coalesce(binding_name,
                        left(regexp_replace((SELECT c.relname FROM pg_class c WHERE c.oid = target) || ':'
                                            || workflow_name, '[^A-Za-z0-9_.:-]', '_', 'g'), 50));
    IF binding !~ '^[A-Za-z0-9_.:-]{1,50}$' THEN
        RAISE EXCEPTION 'bind_table: binding name % is not valid', quote_nullable(binding)
            USING ERRCODE = '22023', HINT = '1 to 50 letters, digits, or _ . : -';
    END IF;
    trigger_name := 'pgdurable:' || binding;

    -- Binding again replaces the binding on the same table; a name bound to another table is refused.
    FOR existing IN SELECT t.tgrelid FROM pg_trigger t WHERE t.tgname = trigger_name AND t.tgfoid = fire LOOP
        IF existing.tgrelid <> target THEN
            RAISE EXCEPTION 'bind_table: binding % already binds table %', binding, existing.tgrelid::regclass
                USING ERRCODE = '42710', HINT = 'unbind it first, or choose another binding name';
        END IF;
        EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, target);
    END LOOP;

    config := jsonb_build_object(
        'name', binding, 'key', to_jsonb(key_columns), 'columns', to_jsonb(columns), 'pass_old', pass_old,
        'common', jsonb_build_object('name', workflow_name, 'queue', queue, 'priority', priority,
                                     'max_recoveries', max_recoveries, 'timeout_seconds', timeout_seconds));
    EXECUTE format(E'CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW %s EXECUTE FUNCTION %I.table_binding_fire(%L)',
                   trigger_name, array_to_string(ARRAY(SELECT upper(o) FROM unnest(ops) AS o ORDER BY o), ' OR '),
                   target, CASE WHEN when_condition IS NOT NULL THEN E'WHEN (\n' || when_condition || E'\n)' ELSE '' END,
                   current_schema(), config::text);
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = target AND t.tgname = trigger_name AND t.tgfoid = fire) THEN
        RAISE EXCEPTION 'bind_table: the when condition changed the trigger''s definition: %', when_condition
            USING ERRCODE = '42601';
    END IF;

    INSERT INTO table_bindings AS b (name, relation, workflow_name, operations, when_condition, key_columns, columns,
                                     pass_old, queue, priority, max_recoveries, timeout_seconds)
    VALUES (binding, qualified, workflow_name, ops, when_condition, key_columns, columns, pass_old, queue,
            priority, max_recoveries, timeout_seconds)
    ON CONFLICT (name) DO UPDATE
    SET relation = EXCLUDED.relation, workflow_name = EXCLUDED.workflow_name, operations = EXCLUDED.operations,
        when_condition = EXCLUDED.when_condition, key_columns = EXCLUDED.key_columns, columns = EXCLUDED.columns,
        pass_old = EXCLUDED.pass_old, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
        max_recoveries = EXCLUDED.max_recoveries, timeout_seconds = EXCLUDED.timeout_seconds, updated_at = now();
    RETURN binding;
END;
$$;

-- Remove a binding: drop its trigger (the caller must own the table) and its row. True if either existed.
-- Executions it already enqueued are left alone.
CREATE FUNCTION unbind_table(binding_name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    fire constant regprocedure := to_regprocedure('table_binding_fire()');
    installed record;
    found_any boolean := false;
BEGIN
    FOR installed IN SELECT t.tgrelid, t.tgname FROM pg_trigger t
                     WHERE t.tgname = 'pgdurable:' || binding_name AND t.tgfoid = fire LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', installed.tgname, installed.tgrelid::regclass);
        found_any := true;
    END LOOP;
    DELETE FROM table_bindings b WHERE b.name = binding_name;
    RETURN found_any OR FOUND;
END;
$$;

-- Every binding, with the table its trigger is on now (NULL: the trigger is gone, e.g. the table was
-- dropped; bind again or unbind).
CREATE FUNCTION list_table_bindings()
RETURNS TABLE (name text, relation text, workflow_name text, operations text[], when_condition text,
               key_columns text[], columns text[], pass_old boolean, queue text, priority integer,
               max_recoveries integer, timeout_seconds double precision, installed_on text,
               created_at timestamptz, updated_at timestamptz)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    SELECT b.name, b.relation, b.workflow_name, b.operations, b.when_condition, b.key_columns, b.columns,
           b.pass_old, b.queue, b.priority, b.max_recoveries, b.timeout_seconds,
           (SELECT t.tgrelid::regclass::text FROM pg_trigger t
            WHERE t.tgname = 'pgdurable:' || b.name AND t.tgfoid = to_regprocedure('table_binding_fire()')
            LIMIT 1),
           b.created_at, b.updated_at
    FROM table_bindings b
    ORDER BY b.name;
$$;

-- Re-create the trigger of every binding whose trigger is gone while its table exists (the table was
-- dropped and created again, or restored without its triggers), from its record. Returns their names.
CREATE FUNCTION restore_table_bindings() RETURNS SETOF text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    missing record;
BEGIN
    FOR missing IN SELECT l.* FROM list_table_bindings() l
                   WHERE l.installed_on IS NULL AND to_regclass(l.relation) IS NOT NULL
                   ORDER BY l.name LOOP
        RETURN NEXT bind_table(missing.relation::regclass, missing.workflow_name, missing.operations,
                               missing.when_condition, missing.name, missing.columns, missing.pass_old,
                               missing.queue, missing.priority, missing.max_recoveries, missing.timeout_seconds);
    END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION table_binding_fire(), bind_table(regclass, text, text[], text, text, text[], boolean, text,
                                                        integer, integer, double precision),
                       unbind_table(text), list_table_bindings(), restore_table_bindings()
    FROM PUBLIC;

-- == Versions ==========================================================================================

-- Every application version with unfinished executions or a live worker: its unfinished executions by
-- status (parked ones apart from the other waiting ones) and its live workers.
CREATE FUNCTION app_versions()
RETURNS TABLE (app_version text, enqueued bigint, waiting bigint, running bigint, parked bigint,
               live_workers bigint)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    WITH unfinished AS (
        SELECT e.app_version,
               count(*) FILTER (WHERE e.status = 'enqueued') AS enqueued,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason IS DISTINCT FROM 'parked') AS waiting,
               count(*) FILTER (WHERE e.status = 'running') AS running,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason = 'parked') AS parked
        FROM workflow_executions e
        WHERE e.status IN ('enqueued', 'waiting', 'running') AND e.app_version IS NOT NULL
        GROUP BY e.app_version
    ), live AS (
        SELECT w.app_version, count(*) AS live_workers
        FROM workers w
        WHERE w.app_version IS NOT NULL AND worker_alive(w.heartbeat_at, w.lease_seconds)
        GROUP BY w.app_version
    )
    SELECT coalesce(u.app_version, l.app_version), coalesce(u.enqueued, 0), coalesce(u.waiting, 0),
           coalesce(u.running, 0), coalesce(u.parked, 0), coalesce(l.live_workers, 0)
    FROM unfinished u FULL JOIN live l ON l.app_version = u.app_version
    ORDER BY 1;
$$;

-- Move the unfinished executions of version old_version to new_version (the workers of new_version resume
-- them), re-enqueueing the parked ones. Running ones keep their owner until that attempt ends: they move
-- too, and the next claim is new_version's. With old_version = new_version, only re-enqueue its parked
-- ones (after a fix deployed under the same, pinned, version). Returns how many executions changed.
CREATE FUNCTION migrate_app_version(old_version text, new_version text) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    moved bigint;
BEGIN
    IF old_version IS NULL OR new_version IS NULL OR new_version = '' THEN
        RAISE EXCEPTION 'migrate_app_version: both versions must be given (got % and %)', old_version, new_version
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workflow_executions e
    SET app_version = new_version,
        status = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN 'enqueued' ELSE e.status END,
        available_at = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN now() ELSE e.available_at END,
        parked_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL ELSE e.parked_reason END,
        wait_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL ELSE e.wait_reason END,
        updated_at = now()
    WHERE e.app_version = old_version AND e.status IN ('enqueued', 'waiting', 'running')
      AND (old_version <> new_version OR (e.status = 'waiting' AND e.wait_reason = 'parked'));
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END;
$$;

-- == Roles and grants ==================================================================================
-- Least privilege: an application role may only enqueue, read status, cancel, send messages and read
-- events through the SQL API functions (no table access); a worker role runs workflows and is trusted with
-- the engine's tables and functions, but only reads the migration history and never touches the grants.

-- The roles given a grant function, and which one (a role may be both). By OID, so a renamed role stays
-- known; a dropped one is forgotten at the next re-application. Forget a role that should keep no grants
-- by deleting its row (and revoking what it holds).
CREATE TABLE granted_roles (
    role_oid   oid         NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('application', 'worker')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role_oid, kind)
);

-- Grant a role what an application needs, and remember it.
CREATE FUNCTION grant_application_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO granted_roles (role_oid, kind) VALUES (role_name::regrole::oid, 'application')
    ON CONFLICT DO NOTHING;
    PERFORM apply_application_grants(role_name);
END;
$$;

-- Grant a role what a worker needs, and remember it.
CREATE FUNCTION grant_worker_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO granted_roles (role_oid, kind) VALUES (role_name::regrole::oid, 'worker')
    ON CONFLICT DO NOTHING;
    PERFORM apply_worker_grants(role_name);
END;
$$;

-- The application role's privileges: the schema, and the functions of the SQL API. Nothing else.
CREATE FUNCTION apply_application_grants(role_name name) RETURNS void
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

-- The worker role's privileges.
CREATE FUNCTION apply_worker_grants(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO %I',
                   schema_name, role_name);
    EXECUTE format('REVOKE ALL ON TABLE %1$I.schema_migrations, %1$I.granted_roles FROM %2$I',
                   schema_name, role_name);
    EXECUTE format('GRANT SELECT ON TABLE %I.schema_migrations TO %I', schema_name, role_name);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %1$I.grant_application_role(name), %1$I.grant_worker_role(name), '
                   '%1$I.apply_application_grants(name), %1$I.apply_worker_grants(name), '
                   '%1$I.reapply_role_grants() FROM %2$I', schema_name, role_name);
END;
$$;

-- Grant again, to every recorded role that still exists, what its kind needs now. The migration runner
-- calls this after applying migrations, so a function or table that a migration created or recreated is
-- granted to the roles that existed before it.
CREATE FUNCTION reapply_role_grants() RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    recorded record;
BEGIN
    DELETE FROM granted_roles g WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.role_oid);
    FOR recorded IN SELECT r.rolname, g.kind FROM granted_roles g JOIN pg_roles r ON r.oid = g.role_oid
                    ORDER BY g.kind, r.rolname LOOP
        IF recorded.kind = 'application' THEN
            PERFORM apply_application_grants(recorded.rolname);
        ELSE
            PERFORM apply_worker_grants(recorded.rolname);
        END IF;
    END LOOP;
END;
$$;

-- Everything above that is not for everybody.
REVOKE ALL ON FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer,
                                        double precision, text, text, jsonb, text, double precision,
                                        double precision),
                       workflow_status(text), cancel_workflow(text),
                       send_message(text, jsonb, text, text), workflow_event(text, text),
                       checkpoint_step(text, integer, integer, text, jsonb, jsonb, integer, timestamptz),
                       set_queue_policy(text, integer, integer, integer, double precision, integer),
                       claim_with_policy(text, text[], text, double precision, integer, text),
                       claim_with_policy_v2(text, text[], text, double precision, integer, text, double precision),
                       app_versions(), migrate_app_version(text, text),
                       clock_now(), notify_channel(text), ring_doorbells(text[]), insert_executions_v1(jsonb, jsonb, boolean), insert_executions_v2(jsonb, jsonb, boolean),
                       insert_execution_v1(text, text, jsonb, text, integer, integer, timestamptz,
                                           double precision, text, text, jsonb),
                       await_execution_v1(text), await_execution_v2(text, boolean),
                       grant_application_role(name), grant_worker_role(name),
                       apply_application_grants(name), apply_worker_grants(name), reapply_role_grants()
    FROM PUBLIC;
