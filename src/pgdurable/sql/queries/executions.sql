-- Named queries on workflow executions. Each block starts with "-- name: <name>"; parameters are psycopg
-- named placeholders. The connection's search_path is the pgdurable schema.

-- name: enqueue
-- One execution, not debounced: the row insert_executions_v2 would write (the rules of that function's first
-- INSERT in sql/schema.sql; tests/test_enqueue_rows.py holds the two to the same rows), in one plain
-- statement. The function's PL/pgSQL call, JSON round trip and table-function result cost about 35 us of
-- server CPU on an insert that itself takes about 150 (docs/benchmarks.md, "One enqueue, one plain INSERT").
-- No row: the id is taken, or an unfinished execution of the queue holds the dedup key (find_enqueued says
-- which). The bells of the queue are rung as the function rings them, but only for a row that can be claimed
-- now: a delayed one rings when the timer's UPDATE makes it due (notify_execution_change).
WITH created AS (
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, dedup_key, concurrency_key, trace_context,
                                          created_at, updated_at, tags)
    SELECT %(id)s::text, %(name)s::text, %(queue)s::text, %(priority)s::int, %(input)s::jsonb,
           %(max_recoveries)s::int, c.at + make_interval(secs => %(delay)s::float8),
           CASE WHEN %(delay)s::float8 > 0 THEN 'waiting' ELSE 'enqueued' END,
           CASE WHEN %(delay)s::float8 > 0 THEN 'delay' END,
           %(timeout)s::float8, %(dedup_key)s::text, %(concurrency_key)s::text, nullif(%(trace)s::jsonb, 'null'),
           c.at, c.at, nullif(nullif(%(tags)s::jsonb, 'null'), '{}')
    FROM (SELECT clock_now() AS at) AS c
    ON CONFLICT DO NOTHING
    RETURNING e.id, e.name, e.queue, e.status
)
SELECT c.id, c.name, true AS created
FROM created AS c
LEFT JOIN LATERAL (SELECT ring_doorbells(ARRAY[c.queue])
                   WHERE c.status = 'enqueued' AND EXISTS (SELECT FROM worker_doorbells WHERE armed)) AS rung ON true;

-- name: enqueue_debounced
-- One debounced execution, through insert_executions_v2 (which holds what a burst does): it returns the
-- burst's pending execution, created or updated (created is true either way). Kept to the insert alone, so
-- that its plan is cached (an OR over optional keys in the same statement made PostgreSQL plan it anew at
-- every call).
SELECT i.id, i.name, true AS created
FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
    'id', %(id)s::text, 'name', %(name)s::text, 'queue', %(queue)s::text, 'priority', %(priority)s::int,
    'input', %(input)s::jsonb, 'max_recoveries', %(max_recoveries)s::int, 'delay_seconds', %(delay)s::float8,
    'timeout_seconds', %(timeout)s::float8, 'dedup_key', %(dedup_key)s::text,
    'concurrency_key', %(concurrency_key)s::text, 'trace_context', %(trace)s::jsonb,
    'tags', %(tags)s::jsonb, 'debounce_key', %(debounce_key)s::text,
    'debounce_seconds', %(debounce_seconds)s::float8,
    'debounce_max_seconds', %(debounce_max_seconds)s::float8))) AS i;

-- name: find_enqueued
-- What an enqueue that created nothing found instead: the execution with its id, else the unfinished one of
-- the queue that holds its dedup key.
(SELECT id, name, false AS created FROM workflow_executions WHERE id = %(id)s)
UNION ALL
(SELECT id, name, false FROM workflow_executions
 WHERE %(dedup_key)s::text IS NOT NULL AND queue = %(queue)s AND dedup_key = %(dedup_key)s::text
   AND status IN ('enqueued', 'waiting', 'running'))
LIMIT 1;

-- name: enqueue_in_transaction
-- Enqueue on the caller's own connection, inside its transaction, through the SQL function (schema-
-- qualified, since the caller's search_path is its own).
SELECT {schema}.enqueue_workflow(%(name)s, %(input)s::jsonb, %(queue)s,
                                 CASE WHEN %(debounce_key)s::text IS NULL THEN %(id)s END, %(priority)s, NULL,
                                 CASE WHEN %(debounce_key)s::text IS NULL THEN make_interval(secs => %(delay)s) END,
                                 %(max_recoveries)s, %(timeout)s, %(dedup_key)s, %(concurrency_key)s,
                                 %(tags)s::jsonb, %(debounce_key)s, %(debounce_seconds)s, %(debounce_max_seconds)s);

-- name: enqueue_many
-- Bulk enqueue of one workflow: %(rows)s is one JSON array of {"id": ..., "input": ...} objects, passed as
-- is to insert_executions_v2 (one parameter, parsed by the server, is far cheaper than two long arrays);
-- the options all rows share go once, in its "common" object. Existing ids are left alone (idempotent);
-- the ids returned are the ones this statement created.
SELECT i.id
FROM insert_executions_v2(
    %(rows)s::jsonb,
    jsonb_build_object('name', %(name)s::text, 'queue', %(queue)s::text, 'priority', %(priority)s::int,
                       'max_recoveries', %(max_recoveries)s::int, 'delay_seconds', %(delay)s::float8,
                       'timeout_seconds', %(timeout)s::float8, 'trace_context', %(trace)s::jsonb,
                       'tags', %(tags)s::jsonb)) AS i;

-- name: names_of
SELECT id, name FROM workflow_executions WHERE id = ANY (%(ids)s);

-- name: start_owned
-- Insert an execution already claimed by this process (App.start runs it in-process). On a queue with a
-- policy (concurrency, rate or per-key limits) it is inserted enqueued instead, like any enqueue, so that
-- the limits decide when it runs and a worker claims it: owned is false then.
WITH limited AS (
    SELECT EXISTS (SELECT 1 FROM queues WHERE name = %(queue)s) AS yes
), inserted AS (
    SELECT i.id, i.name, i.attempt, i.input, i.status = 'running' AS owned
    FROM limited, LATERAL insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', %(id)s::text, 'name', %(name)s::text, 'queue', %(queue)s::text, 'priority', %(priority)s::int,
        'input', %(input)s::jsonb, 'max_recoveries', %(max_recoveries)s::int,
        'timeout_seconds', %(timeout)s::float8, 'trace_context', %(trace)s::jsonb, 'tags', %(tags)s::jsonb,
        'owner_id', CASE WHEN limited.yes THEN NULL ELSE %(owner)s::text END,
        'lease_seconds', %(lease)s::float8,
        'app_version', CASE WHEN limited.yes THEN NULL ELSE %(version)s::text END))) AS i
)
SELECT id, name, true, attempt, input, clock_now() AS db_now, owned FROM inserted
UNION ALL
SELECT id, name, false, attempt, input, clock_now(), false FROM workflow_executions
WHERE id = %(id)s AND NOT EXISTS (SELECT 1 FROM inserted);

-- name: claim
-- Take up to %(limit)s runnable executions of one queue: mark them running, owned by this worker, with a
-- fresh lease and a new attempt number (the fencing token). Equality on the queue lets the scan follow
-- workflow_executions_claim_idx in order and stop after LIMIT rows, however long the backlog is.
-- SKIP LOCKED lets concurrent workers claim different rows; FOR NO KEY UPDATE is the lock the update takes
-- anyway (a result waiter registering locks no row: see awaited_executions). An execution
-- started by another application version is left to workers of that version, unless this worker adopts
-- (%(adopt)s seconds, NULL: never) and no worker of it heartbeated for that long (see "adoption" below);
-- the claim stamps our version (and returns the one it had), and the first claim fixes the deadline of an
-- execution with a timeout.
-- Availability, deadlines, the times stamped and the time returned (the start of durable timers) are
-- durable time, clock_now() (one value in a statement); the lease and worker liveness are not.
-- With %(arm)s, a claim that finds nothing (the queue ran dry) also arms this worker's doorbell for the
-- queue (see arm_doorbell), in the same round trip and commit: the producer is about to sleep. A claim that
-- finds work writes nothing more: its commit is on the path from enqueue to start.
WITH picked AS (
    SELECT id, app_version AS previous_version
    FROM workflow_executions
    WHERE status = 'enqueued'
      AND queue = %(queue)s
      AND name = ANY (%(names)s)
      AND available_at <= clock_now()
      AND (app_version IS NULL OR app_version = %(version)s
           -- adoption: one hashed subplan per statement, over the few live workers (heartbeats are on now())
           OR (%(adopt)s::float8 IS NOT NULL
               AND app_version NOT IN (SELECT w.app_version FROM workers w
                                       WHERE w.app_version IS NOT NULL
                                         AND w.heartbeat_at > now() - make_interval(secs => %(adopt)s::float8))))
    ORDER BY priority, seq
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), armed AS (  -- as arm_doorbell: a bell already armed is left alone, unlocked
    UPDATE worker_doorbells SET armed = true
    WHERE queue = %(queue)s AND worker_id = %(owner)s AND NOT armed
      AND %(arm)s AND NOT EXISTS (SELECT FROM picked)
), installed AS (
    INSERT INTO worker_doorbells (queue, worker_id)
    SELECT %(queue)s, %(owner)s
    WHERE %(arm)s AND NOT EXISTS (SELECT FROM picked)
      AND NOT EXISTS (SELECT FROM worker_doorbells WHERE queue = %(queue)s AND worker_id = %(owner)s)
    ON CONFLICT DO NOTHING
)
UPDATE workflow_executions e
SET status = 'running',
    owner_id = %(owner)s,
    lease_expires = now() + make_interval(secs => %(lease)s),
    attempt = e.attempt + 1,
    started_at = coalesce(e.started_at, clock_now()),
    updated_at = clock_now(),
    app_version = %(version)s,
    wait_reason = NULL,
    deadline = CASE WHEN e.timeout_seconds IS NOT NULL AND (e.deadline IS NULL OR e.started_at IS NULL)
                    -- clamped (the table's CHECK holds it there too): no row can make the claim raise
                    THEN least(coalesce(e.deadline, 'infinity'),
                               clock_now() + make_interval(secs => least(e.timeout_seconds, 315360000)))
                    ELSE e.deadline END
FROM picked
WHERE e.id = picked.id
RETURNING e.id, e.name, e.attempt, e.input, clock_now() AS db_now,
          e.attempt > 1 OR e.forked_from IS NOT NULL AS has_history, picked.previous_version;

-- name: claim_with_policy
-- The claim of a queue with a policy (concurrency, rate or per-key limits): see the SQL function.
SELECT * FROM claim_with_policy_v2(%(queue)s, %(names)s, %(owner)s, %(lease)s, %(limit)s, %(version)s,
                                   %(adopt)s::float8);

-- name: queue_policies
SELECT name, concurrency, worker_concurrency, rate_limit, rate_period_seconds, key_concurrency
FROM queues
WHERE %(names)s::text[] IS NULL OR name = ANY (%(names)s::text[])
ORDER BY name;

-- name: set_queue_policy
SELECT set_queue_policy(%(name)s, %(concurrency)s, %(worker_concurrency)s, %(rate_limit)s,
                        %(rate_period_seconds)s, %(key_concurrency)s);

-- name: load_steps
SELECT execution_id, step_id, step_name, output, error
FROM operation_outputs
WHERE execution_id = ANY (%(ids)s)
ORDER BY execution_id, step_id;

-- name: write_steps
-- A worker's group commit of step checkpoints: many executions' steps in one statement, each written only
-- while its writer still owns the execution's current attempt (fencing). FOR SHARE holds those execution
-- rows until this commits, so a concurrent sweep or claim waits, and a new owner never loads the steps
-- without this batch's rows; the rows are locked in id order. The batch is one JSON array of
-- [execution_id, attempt, step_id, step_name, tries, started_at, output, error] (one parameter that the
-- server parses is much cheaper to send than eight arrays). completed_at is durable time. One INSERT ...
-- SELECT with no CTE: the CTEs this statement had (durable time read once, the owned rows) cost a one-step
-- batch about 20 us of server time to set up (docs/benchmarks.md, "Checkpoints without CTEs").
-- The lease test is written `(... > now()) IS TRUE`, here and in every statement fenced by it, so that it is
-- not an index condition. The statistics of lease_expires are always stale (leases move forward with time,
-- and PostgreSQL reads an index for a column's actual range only if the index has no predicate), so it took
-- "lease_expires > now()" for a handful of rows: a statement fenced on one execution (write_step, the waits)
-- read every running execution through the lease index instead of its primary key. This statement hash-joins
-- the running executions, read whole, which suits a large batch; a batch of a few rows goes to
-- write_steps_few, which looks each up by its id (docs/benchmarks.md, "Batches beside many running
-- executions").
INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts, recorded_by_attempt,
                               started_at, completed_at)
SELECT e.id, (r ->> 2)::int, r ->> 3, CASE WHEN nullif(r -> 7, 'null') IS NULL THEN r -> 6 END,
       nullif(r -> 7, 'null'), (r ->> 4)::int, e.attempt, (r ->> 5)::timestamptz, clock_now()
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
JOIN workflow_executions e ON e.id = r ->> 0
WHERE e.attempt = (r ->> 1)::int AND e.status = 'running' AND (e.lease_expires > now()) IS TRUE
ORDER BY e.id
FOR SHARE OF e
ON CONFLICT (execution_id, step_id) DO NOTHING
RETURNING execution_id, recorded_by_attempt, step_id;

-- name: write_steps_few
-- write_steps for a batch of a few rows (at most batch_plan.FEW_ROWS), each execution looked up by its id, at
-- the same cost however many run. "n BETWEEN 1 AND 2147483647" holds for every row of the array, but
-- PostgreSQL, with no statistics on it, takes it for a narrow range: it plans for one row (it takes a JSON
-- array for 100), in custom and generic plans alike (the plan cache keeps the generic one), and with the
-- status test inside IS TRUE too, no index but the primary key can serve the fence. write_steps instead
-- hash-joins all running executions: what a large batch wants, and about 2 ms for a batch of one beside ten
-- thousand (docs/benchmarks.md, "Batches beside many running executions").
INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts, recorded_by_attempt,
                               started_at, completed_at)
SELECT e.id, (r ->> 2)::int, r ->> 3, CASE WHEN nullif(r -> 7, 'null') IS NULL THEN r -> 6 END,
       nullif(r -> 7, 'null'), (r ->> 4)::int, e.attempt, (r ->> 5)::timestamptz, clock_now()
FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS batch (r, n)
JOIN workflow_executions e ON e.id = r ->> 0
WHERE n BETWEEN 1 AND 2147483647
  AND e.attempt = (r ->> 1)::int AND (e.status = 'running' AND e.lease_expires > now()) IS TRUE
ORDER BY e.id
FOR SHARE OF e
ON CONFLICT (execution_id, step_id) DO NOTHING
RETURNING execution_id, recorded_by_attempt, step_id;

-- name: write_step
-- write_steps for a batch of one step, the common case (a workflow's steps in sequence, each waiting for its
-- checkpoint): the same fence and the same row, from scalar parameters. Without the JSON array and the join
-- it needs, the statement costs about a quarter less server time (docs/benchmarks.md, "Checkpoints without
-- CTEs"). %(output)s and %(error)s are JSON texts; an error means no output is kept, as in write_steps.
INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts, recorded_by_attempt,
                               started_at, completed_at)
SELECT e.id, %(step_id)s::int, %(step_name)s::text,
       CASE WHEN nullif(%(error)s::jsonb, 'null') IS NULL THEN %(output)s::jsonb END,
       nullif(%(error)s::jsonb, 'null'), %(tries)s::int, e.attempt, %(started_at)s::timestamptz, clock_now()
FROM workflow_executions e
WHERE e.id = %(execution_id)s::text AND e.attempt = %(attempt)s::int AND e.status = 'running'
  AND (e.lease_expires > now()) IS TRUE
FOR SHARE OF e
ON CONFLICT (execution_id, step_id) DO NOTHING
RETURNING execution_id, recorded_by_attempt, step_id;

-- name: write_completions
-- A worker's group commit of finished executions, each only while its writer still owns the attempt.
-- The batch is one JSON array of [execution_id, attempt, status, output, error]. completed_at is durable
-- time. %(bells)s, a JSON array of [worker_id, queue]: the doorbells the worker arms as it
-- completes its last execution of a queue that ran dry (see arm_doorbell), in this statement, so that they
-- are armed before anyone hears of the results.
WITH finished AS (
    SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, r ->> 2 AS status,
           r -> 3 AS output, nullif(r -> 4, 'null') AS error
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
), bells AS (
    SELECT b ->> 0 AS worker_id, b ->> 1 AS queue FROM jsonb_array_elements(%(bells)s::jsonb) AS b
), armed AS (
    UPDATE worker_doorbells d SET armed = true
    FROM bells b
    WHERE d.worker_id = b.worker_id AND d.queue = b.queue AND NOT d.armed
), installed AS (
    INSERT INTO worker_doorbells (queue, worker_id)
    SELECT b.queue, b.worker_id FROM bells b
    WHERE NOT EXISTS (SELECT FROM worker_doorbells d WHERE d.worker_id = b.worker_id AND d.queue = b.queue)
    ON CONFLICT DO NOTHING
)
UPDATE workflow_executions e
SET status = f.status, output = CASE WHEN f.error IS NULL THEN f.output END, error = f.error,
    owner_id = NULL, lease_expires = NULL, completed_at = clock_now(), updated_at = clock_now(), wait_reason = NULL
FROM finished f
WHERE e.id = f.id AND e.attempt = f.attempt AND e.status = 'running' AND (e.lease_expires > now()) IS TRUE
RETURNING e.id, e.attempt, NULL::int;

-- name: write_completions_few
-- write_completions for a batch of a few rows, planned for one and looked up by id: see write_steps_few.
WITH finished AS (
    SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, r ->> 2 AS status,
           r -> 3 AS output, nullif(r -> 4, 'null') AS error
    FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS batch (r, n)
    WHERE n BETWEEN 1 AND 2147483647  -- every row: see write_steps_few
), bells AS (
    SELECT b ->> 0 AS worker_id, b ->> 1 AS queue FROM jsonb_array_elements(%(bells)s::jsonb) AS b
), armed AS (
    UPDATE worker_doorbells d SET armed = true
    FROM bells b
    WHERE d.worker_id = b.worker_id AND d.queue = b.queue AND NOT d.armed
), installed AS (
    INSERT INTO worker_doorbells (queue, worker_id)
    SELECT b.queue, b.worker_id FROM bells b
    WHERE NOT EXISTS (SELECT FROM worker_doorbells d WHERE d.worker_id = b.worker_id AND d.queue = b.queue)
    ON CONFLICT DO NOTHING
)
UPDATE workflow_executions e
SET status = f.status, output = CASE WHEN f.error IS NULL THEN f.output END, error = f.error,
    owner_id = NULL, lease_expires = NULL, completed_at = clock_now(), updated_at = clock_now(), wait_reason = NULL
FROM finished f
WHERE e.id = f.id AND e.attempt = f.attempt AND (e.status = 'running' AND e.lease_expires > now()) IS TRUE
RETURNING e.id, e.attempt, NULL::int;

-- name: write_checkpoints
-- write_steps and write_completions of one batch in one statement (one round trip instead of BEGIN, the two
-- statements and COMMIT). The steps of an execution this statement completes are written only if the
-- completion was (the UPDATE's row lock is the fence, as FOR SHARE is for the others); the other steps are
-- fenced as write_steps fences them. Returns what both return.
WITH finished AS (
    SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, r ->> 2 AS status,
           r -> 3 AS output, nullif(r -> 4, 'null') AS error
    FROM jsonb_array_elements(%(completions)s::jsonb) AS r
), bells AS (
    SELECT b ->> 0 AS worker_id, b ->> 1 AS queue FROM jsonb_array_elements(%(bells)s::jsonb) AS b
), armed AS (
    UPDATE worker_doorbells d SET armed = true
    FROM bells b
    WHERE d.worker_id = b.worker_id AND d.queue = b.queue AND NOT d.armed
), installed AS (
    INSERT INTO worker_doorbells (queue, worker_id)
    SELECT b.queue, b.worker_id FROM bells b
    WHERE NOT EXISTS (SELECT FROM worker_doorbells d WHERE d.worker_id = b.worker_id AND d.queue = b.queue)
    ON CONFLICT DO NOTHING
), done AS (
    UPDATE workflow_executions e
    SET status = f.status, output = CASE WHEN f.error IS NULL THEN f.output END, error = f.error,
        owner_id = NULL, lease_expires = NULL, completed_at = clock_now(), updated_at = clock_now(), wait_reason = NULL
    FROM finished f
    WHERE e.id = f.id AND e.attempt = f.attempt AND e.status = 'running' AND (e.lease_expires > now()) IS TRUE
    RETURNING e.id, e.attempt
), steps AS (
    SELECT r ->> 0 AS execution_id, (r ->> 1)::int AS attempt, (r ->> 2)::int AS step_id,
           r ->> 3 AS step_name, (r ->> 4)::int AS tries, (r ->> 5)::timestamptz AS started_at,
           r -> 6 AS output, nullif(r -> 7, 'null') AS error
    FROM jsonb_array_elements(%(steps)s::jsonb) AS r
), owned AS (
    SELECT s.*
    FROM steps s JOIN workflow_executions e ON e.id = s.execution_id
    WHERE e.attempt = s.attempt AND e.status = 'running' AND (e.lease_expires > now()) IS TRUE
      AND NOT EXISTS (SELECT FROM finished f WHERE f.id = s.execution_id AND f.attempt = s.attempt)
    ORDER BY e.id
    FOR SHARE OF e
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT execution_id, step_id, step_name, CASE WHEN error IS NULL THEN output END, error, tries, attempt,
           started_at, clock_now()
    FROM (SELECT * FROM owned
          UNION ALL
          SELECT s.* FROM steps s JOIN done d ON d.id = s.execution_id AND d.attempt = s.attempt) AS w
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING execution_id, recorded_by_attempt, step_id
)
SELECT id, attempt, NULL::int FROM done
UNION ALL
SELECT execution_id, recorded_by_attempt, step_id FROM recorded;

-- name: write_checkpoints_few
-- write_checkpoints for a batch of a few rows, planned for one and looked up by id: see write_steps_few. (A
-- large batch must not be planned so: its steps would be matched to its completions by nested loops.)
WITH finished AS (
    SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, r ->> 2 AS status,
           r -> 3 AS output, nullif(r -> 4, 'null') AS error
    FROM jsonb_array_elements(%(completions)s::jsonb) WITH ORDINALITY AS batch (r, n)
    WHERE n BETWEEN 1 AND 2147483647  -- every row: see write_steps_few
), bells AS (
    SELECT b ->> 0 AS worker_id, b ->> 1 AS queue FROM jsonb_array_elements(%(bells)s::jsonb) AS b
), armed AS (
    UPDATE worker_doorbells d SET armed = true
    FROM bells b
    WHERE d.worker_id = b.worker_id AND d.queue = b.queue AND NOT d.armed
), installed AS (
    INSERT INTO worker_doorbells (queue, worker_id)
    SELECT b.queue, b.worker_id FROM bells b
    WHERE NOT EXISTS (SELECT FROM worker_doorbells d WHERE d.worker_id = b.worker_id AND d.queue = b.queue)
    ON CONFLICT DO NOTHING
), done AS (
    UPDATE workflow_executions e
    SET status = f.status, output = CASE WHEN f.error IS NULL THEN f.output END, error = f.error,
        owner_id = NULL, lease_expires = NULL, completed_at = clock_now(), updated_at = clock_now(), wait_reason = NULL
    FROM finished f
    WHERE e.id = f.id AND e.attempt = f.attempt AND (e.status = 'running' AND e.lease_expires > now()) IS TRUE
    RETURNING e.id, e.attempt
), steps AS (
    SELECT r ->> 0 AS execution_id, (r ->> 1)::int AS attempt, (r ->> 2)::int AS step_id,
           r ->> 3 AS step_name, (r ->> 4)::int AS tries, (r ->> 5)::timestamptz AS started_at,
           r -> 6 AS output, nullif(r -> 7, 'null') AS error
    FROM jsonb_array_elements(%(steps)s::jsonb) WITH ORDINALITY AS batch (r, n)
    WHERE n BETWEEN 1 AND 2147483647  -- every row: see write_steps_few
), owned AS (
    SELECT s.*
    FROM steps s JOIN workflow_executions e ON e.id = s.execution_id
    WHERE e.attempt = s.attempt AND (e.status = 'running' AND e.lease_expires > now()) IS TRUE
      AND NOT EXISTS (SELECT FROM finished f WHERE f.id = s.execution_id AND f.attempt = s.attempt)
    ORDER BY e.id
    FOR SHARE OF e
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT execution_id, step_id, step_name, CASE WHEN error IS NULL THEN output END, error, tries, attempt,
           started_at, clock_now()
    FROM (SELECT * FROM owned
          UNION ALL
          SELECT s.* FROM steps s JOIN done d ON d.id = s.execution_id AND d.attempt = s.attempt) AS w
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING execution_id, recorded_by_attempt, step_id
)
SELECT id, attempt, NULL::int FROM done
UNION ALL
SELECT execution_id, recorded_by_attempt, step_id FROM recorded;

-- name: heartbeat
-- Extend the leases of the executions this worker is running; the rows returned are what it still owns.
-- An execution it gave up on locally is left out, so its lease runs out and another worker retries it.
UPDATE workflow_executions
SET lease_expires = now() + make_interval(secs => %(lease)s)
WHERE owner_id = %(owner)s AND status = 'running' AND id = ANY (%(ids)s)
RETURNING id, attempt;

-- name: release
-- Graceful shutdown: hand unfinished executions back to the queue; they resume from their checkpoints.
UPDATE workflow_executions
SET status = 'enqueued', owner_id = NULL, lease_expires = NULL, updated_at = clock_now()
WHERE owner_id = %(owner)s AND status = 'running' AND id = ANY (%(ids)s)
RETURNING id;

-- name: sweep_expired
-- Re-enqueue executions whose lease expired (their worker died or stalled), or dead-letter those that
-- have already been recovered too often. SKIP LOCKED makes concurrent sweepers split the work. Leases are
-- liveness time (now()); the times stamped are durable time (clock).
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), expired AS (
    SELECT id FROM workflow_executions
    WHERE status = 'running' AND lease_expires < now()
    ORDER BY lease_expires
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE workflow_executions e
SET status = CASE WHEN e.recoveries + 1 > e.max_recoveries THEN 'failed' ELSE 'enqueued' END,
    error = CASE WHEN e.recoveries + 1 > e.max_recoveries
                 THEN jsonb_build_object(
                        'type', 'pgdurable.DeadLettered',
                        'message', format('the worker running this execution was lost %%s times '
                                          '(last owner %%s); giving up after max_recoveries=%%s',
                                          e.recoveries + 1, e.owner_id, e.max_recoveries))
                 ELSE e.error END,
    completed_at = CASE WHEN e.recoveries + 1 > e.max_recoveries THEN clock.now END,
    wait_reason = CASE WHEN e.recoveries + 1 > e.max_recoveries THEN NULL ELSE e.wait_reason END,
    recoveries = e.recoveries + 1,
    owner_id = NULL,
    lease_expires = NULL,
    updated_at = clock.now
FROM expired, clock
WHERE e.id = expired.id AND e.status = 'running' AND e.lease_expires < now()
RETURNING e.id, e.status, e.recoveries;

-- name: fail_unrunnable
-- Fail executions that sat enqueued for longer than %(grace)s seconds on a queue that live workers serve,
-- none of which knows the workflow's name. Executions on a queue nobody serves are left alone. Workers'
-- liveness is on now(), availability on durable time (clock).
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), stuck AS (
    SELECT e.id FROM workflow_executions e
    WHERE e.status = 'enqueued'
      AND e.available_at < (SELECT now FROM clock) - make_interval(secs => %(grace)s)
      AND EXISTS (SELECT 1 FROM workers w
                  WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds))
      AND NOT EXISTS (SELECT 1 FROM workers w
                      WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                        AND worker_alive(w.heartbeat_at, w.lease_seconds))
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE workflow_executions e
SET status = 'failed', completed_at = clock.now, updated_at = clock.now, wait_reason = NULL,
    error = jsonb_build_object(
        'type', 'pgdurable.UnknownWorkflow',
        'message', format('no live worker serving queue %%L registers workflow %%L', e.queue, e.name))
FROM stuck, clock
WHERE e.id = stuck.id AND e.status = 'enqueued'
RETURNING e.id, e.name;

-- name: get_execution
SELECT id, name, queue, status, priority, input, output, error, owner_id, lease_expires, attempt,
       recoveries, max_recoveries, available_at, created_at, updated_at, started_at, completed_at,
       wait_reason, parent_id, forked_from, timeout_seconds, deadline, app_version, dedup_key, concurrency_key,
       tags, debounce_key, parked_reason
FROM workflow_executions
WHERE id = %(id)s;

-- name: get_status
SELECT status, output, error FROM workflow_executions WHERE id = %(id)s;

-- name: await_status
-- The status of an execution about to be waited for; an unfinished one is registered as awaited, so that
-- its completion notifies, with the outcome when it fits ("_result"; see await_execution_v2 for how the
-- registration and the completion are ordered, and what seen, the look's snapshot, is for).
SELECT status, output, error, seen::text FROM await_execution_v2(%(id)s, true);

-- name: list_executions
SELECT id, name, queue, status, priority, input, output, error, owner_id, lease_expires, attempt,
       recoveries, max_recoveries, available_at, created_at, updated_at, started_at, completed_at,
       wait_reason, parent_id, forked_from, timeout_seconds, deadline, app_version, dedup_key, concurrency_key,
       tags, debounce_key, parked_reason
FROM workflow_executions
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY created_at DESC, id
LIMIT %(limit)s;

-- name: list_executions_by_tags
-- list_executions of those whose tags contain %(tags)s (a JSON object): the containment is answered by
-- workflow_executions_tags_idx (GIN, jsonb_path_ops), then the few matches are sorted.
SELECT id, name, queue, status, priority, input, output, error, owner_id, lease_expires, attempt,
       recoveries, max_recoveries, available_at, created_at, updated_at, started_at, completed_at,
       wait_reason, parent_id, forked_from, timeout_seconds, deadline, app_version, dedup_key, concurrency_key,
       tags, debounce_key
FROM workflow_executions
WHERE tags @> %(tags)s::jsonb
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY created_at DESC, id
LIMIT %(limit)s;

-- name: set_tags
-- pgdurable.set_tags: add to the execution's tags and record the step, in one statement, fenced like every
-- step (no row updated, nothing recorded, when the writer no longer owns the execution).
WITH owned AS (
    UPDATE workflow_executions
    SET tags = nullif(coalesce(tags, '{}') || %(tags)s::jsonb, '{}'), updated_at = clock_now()
    WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
    RETURNING id
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT owned.id, %(step_id)s, %(step_name)s, 'null', NULL, 1, %(attempt)s, %(started_at)s, clock_now()
    FROM owned
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM recorded;

-- name: list_steps
SELECT step_id, step_name, output, error, attempts, recorded_by_attempt, started_at, completed_at
FROM operation_outputs
WHERE execution_id = %(id)s
ORDER BY step_id;

-- name: cancel
-- Cascades to unfinished descendants (see the SQL function).
SELECT cancel_workflow(%(id)s);

-- name: resume
-- Re-enqueue a failed or cancelled execution, in one statement: the row is locked first, then a failed step's
-- recorded error and anything recorded after it are dropped (the step runs again), then it is enqueued.
WITH target AS (
    SELECT id FROM workflow_executions
    WHERE id = %(id)s AND status IN ('failed', 'cancelled')
    FOR UPDATE
), forgotten AS (
    DELETE FROM operation_outputs o
    USING target
    WHERE o.execution_id = target.id
      AND o.step_id >= (SELECT min(step_id) FROM operation_outputs
                        WHERE execution_id = target.id AND error IS NOT NULL)
)
UPDATE workflow_executions e
SET status = 'enqueued', output = NULL, error = NULL, recoveries = 0, completed_at = NULL,
    available_at = clock_now(), updated_at = clock_now(), deadline = NULL, wait_reason = NULL
FROM target
WHERE e.id = target.id
RETURNING e.id;

-- name: unserved
-- Why no worker runs an enqueued execution: whether a live worker serves its queue, and whether one of those
-- knows its workflow (both true, or not enqueued: nothing is missing). For the timeout error of result().
SELECT e.status, e.queue, e.name,
       EXISTS (SELECT 1 FROM workers w
               WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds)) AS served,
       EXISTS (SELECT 1 FROM workers w
               WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                 AND worker_alive(w.heartbeat_at, w.lease_seconds)) AS known
FROM workflow_executions e
WHERE e.id = %(id)s;

-- name: queue_depths
-- Unfinished executions by queue and status, with the age of the oldest available one (metrics, status).
SELECT queue, status, count(*) AS count,
       extract(epoch FROM clock.now) - extract(epoch FROM min(available_at) FILTER (WHERE status = 'enqueued'))
           AS oldest_seconds
FROM workflow_executions, (SELECT clock_now() AS now) AS clock
WHERE status IN ('enqueued', 'waiting', 'running')
GROUP BY queue, status, clock.now
ORDER BY queue, status;

-- name: trace_contexts
SELECT id, trace_context::text FROM workflow_executions
WHERE id = ANY (%(ids)s) AND trace_context IS NOT NULL;
