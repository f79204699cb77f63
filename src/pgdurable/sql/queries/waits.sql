-- Named queries for what workflows wait on: suspension, the timer, messages, events, child workflows,
-- deadlines and forks. Statements that record a step check ownership exactly like write_steps: the
-- writer's attempt, still running, lease not expired, the row held FOR SHARE until the write commits.
-- (The lease test is `(lease_expires > now()) IS TRUE`, not an index condition: see write_steps.)

-- name: suspend
-- Give up the worker slot: the execution waits until %(wake_at)s (NULL: until woken) for %(reason)s.
-- With %(wakeups)s given, only if nothing tried to wake it since the worker looked (else no row: look
-- again). No row either when the writer no longer owns the execution. A wake-up later than the table allows
-- (sleep_until(datetime.max)) is stored as the latest time it allows: the workflow, woken then, sleeps again.
UPDATE workflow_executions
SET status = 'waiting', owner_id = NULL, lease_expires = NULL, wait_reason = %(reason)s,
    available_at = CASE WHEN %(wake_at)s::timestamptz > '9999-12-30 00:00:00+00'
                        THEN '9999-12-30 00:00:00+00' ELSE %(wake_at)s::timestamptz END,
    updated_at = clock_now()
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
  AND (%(wakeups)s::bigint IS NULL OR wakeups = %(wakeups)s::bigint)
RETURNING id;

-- name: wake_due
-- The timer: enqueue waiting executions whose time has come (their NOTIFY wakes the workers), and say
-- when the next one is due, on clock_now() (now(), unless a test moves it). SKIP LOCKED lets every
-- worker's timer run without waiting on the others.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), due AS (
    SELECT id FROM workflow_executions
    WHERE status = 'waiting' AND available_at <= (SELECT now FROM clock)
    ORDER BY available_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE workflow_executions e
    SET status = 'enqueued', wait_reason = NULL, updated_at = (SELECT now FROM clock)
    FROM due
    WHERE e.id = due.id AND e.status = 'waiting'
    RETURNING e.id
)
SELECT (SELECT count(*) FROM woken) AS woken,
       (SELECT min(available_at) FROM workflow_executions
        WHERE status = 'waiting' AND available_at > (SELECT now FROM clock)) AS next_due,
       (SELECT now FROM clock) AS now;

-- name: expire_deadlines
-- Fail unfinished executions past their deadline (their children have inherited it and fail alike). A
-- running one's owner is notified and stops; its writes are refused from now on.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), late AS (
    SELECT id FROM workflow_executions
    WHERE deadline < (SELECT now FROM clock) AND status IN ('enqueued', 'waiting', 'running')
    ORDER BY deadline
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE workflow_executions e
SET status = 'failed', owner_id = NULL, lease_expires = NULL, wait_reason = NULL,
    completed_at = clock.now, updated_at = clock.now,
    error = jsonb_build_object(
        'type', 'pgdurable.WorkflowTimeout',
        'message', format('deadline %%s passed (timeout %%s s)', e.deadline, e.timeout_seconds))
FROM late, clock
WHERE e.id = late.id AND e.status IN ('enqueued', 'waiting', 'running') AND e.deadline < clock.now
RETURNING e.id;

-- name: receive
-- Take the oldest unconsumed message on a topic and record it as the receiving step, in one statement:
-- a message is consumed if and only if its step is recorded by this statement. Also returns the
-- execution's wake-up count as of this statement's snapshot (not as locked: a send that commits while we wait for the lock must
-- make the suspend that follows fail and look again).
WITH seen AS (
    SELECT wakeups FROM workflow_executions WHERE id = %(id)s
), owned AS (
    SELECT id FROM workflow_executions
    WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
    FOR SHARE
), next_message AS (
    SELECT m.id, m.message
    FROM workflow_messages m, owned
    WHERE m.destination_id = owned.id AND m.topic = %(topic)s AND m.consumed_at IS NULL
    ORDER BY m.id
    LIMIT 1
    FOR UPDATE OF m
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT %(id)s, %(step_id)s, %(step_name)s, next_message.message, NULL, 1, %(attempt)s, %(started_at)s,
           clock_now()
    FROM next_message
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING output
), consumed AS (
    -- only a message whose receive step was recorded here is consumed
    UPDATE workflow_messages m
    SET consumed_at = clock_now(), consumed_by_step = %(step_id)s
    FROM next_message, recorded
    WHERE m.id = next_message.id
)
SELECT (SELECT count(*) FROM owned) AS owned, (SELECT wakeups FROM seen) AS wakeups,
       (SELECT count(*) FROM recorded) AS found, (SELECT output::text FROM recorded) AS message;

-- name: send_message
SELECT send_message(%(destination)s, %(message)s::jsonb, %(topic)s, %(key)s);

-- name: send_message_in_transaction
SELECT {schema}.send_message(%(destination)s, %(message)s::jsonb, %(topic)s, %(key)s);

-- name: list_messages
SELECT id, topic, message, idempotency_key, created_at, consumed_at, consumed_by_step
FROM workflow_messages
WHERE destination_id = %(id)s
ORDER BY id;

-- name: set_event
-- Publish an event and record the publishing step together (fenced like every step).
WITH owned AS (
    SELECT id FROM workflow_executions
    WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
    FOR SHARE
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT owned.id, %(step_id)s, %(step_name)s, 'null', NULL, 1, %(attempt)s, %(started_at)s, clock_now()
    FROM owned
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING execution_id, completed_at
), published AS (
    INSERT INTO workflow_events (execution_id, key, step_id, value, created_at)
    SELECT execution_id, %(key)s, %(step_id)s, %(value)s::jsonb, completed_at FROM recorded
    RETURNING 1
)
SELECT count(*) FROM published;

-- name: get_event
SELECT value::text FROM workflow_events
WHERE execution_id = %(id)s AND key = %(key)s
ORDER BY step_id DESC
LIMIT 1;

-- name: list_events
SELECT key, step_id, value, created_at FROM workflow_events
WHERE execution_id = %(id)s
ORDER BY key, step_id;

-- name: enqueue_child
-- Start a child execution and record its id as the parent's step, in one statement. The child inherits
-- the parent's deadline. Its id is deterministic, so a replay that gets here again finds it. An id that
-- already belongs to another workflow is recorded as the step's error (WorkflowIdConflict), so that a
-- replay raises it again instead of taking the "no conflict" path.
WITH owned AS (
    SELECT id, deadline FROM workflow_executions
    WHERE id = %(parent)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
    FOR SHARE
), child AS (
    SELECT i.id
    FROM owned, LATERAL insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', %(id)s::text, 'name', %(name)s::text, 'queue', %(queue)s::text, 'priority', %(priority)s::int,
        'input', %(input)s::jsonb, 'max_recoveries', %(max_recoveries)s::int, 'delay_seconds', %(delay)s::float8,
        'timeout_seconds', %(timeout)s::float8, 'parent_id', owned.id, 'deadline', owned.deadline,
        'concurrency_key', %(concurrency_key)s::text, 'trace_context', %(trace)s::jsonb,
        'tags', %(tags)s::jsonb))) AS i
), conflict AS (
    SELECT jsonb_build_object('type', 'pgdurable.errors.WorkflowIdConflict', 'message', m.message,
                              'args', jsonb_build_array(m.message)) AS error
    FROM workflow_executions e,
         LATERAL (SELECT format('workflow id %%s already belongs to an execution of %%s, not %%s',
                                quote_literal(e.id), quote_literal(e.name), quote_literal(%(name)s::text))
                  AS message) AS m
    WHERE e.id = %(id)s AND e.name <> %(name)s AND NOT EXISTS (SELECT 1 FROM child)
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT owned.id, %(step_id)s, %(step_name)s,
           CASE WHEN conflict.error IS NULL THEN to_jsonb(%(id)s::text) END, conflict.error, 1, %(attempt)s,
           %(started_at)s, clock_now()
    FROM owned LEFT JOIN conflict ON true
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM recorded) AS recorded,
       (SELECT count(*) FROM child) AS created,
       (SELECT name FROM workflow_executions WHERE id = %(id)s) AS name,
       (SELECT error::text FROM conflict) AS conflict;

-- name: awaited_status
-- The outcome of awaited executions, and the waiter's wake-up count from the same snapshot: a child
-- that finishes later bumps the count, which makes the waiter's suspend fail and look again. No rows
-- when the waiter no longer owns its execution.
SELECT w.wakeups, a.id, e.status, e.output::text AS output, e.error::text AS error, e.parent_id = w.id AS is_child
FROM workflow_executions w
CROSS JOIN unnest(%(ids)s::text[]) AS a (id)
LEFT JOIN workflow_executions e ON e.id = a.id
WHERE w.id = %(id)s AND w.attempt = %(attempt)s AND w.status = 'running' AND (w.lease_expires > now()) IS TRUE;

-- name: list_children
SELECT id, name, status, created_at, completed_at FROM workflow_executions
WHERE parent_id = %(id)s
ORDER BY created_at, id;

-- name: fork
-- A new execution of the same workflow and input that reuses the recorded steps before %(from_step)s
-- and runs from there (on whichever application version claims it). It keeps the source's options
-- (queue, priority, recoveries, timeout, concurrency key), all but its dedup key: a fork is a deliberate
-- second run.
WITH found AS (
    SELECT * FROM workflow_executions WHERE id = %(source)s
), recorded AS (
    -- Step ids run from 0: forking from one past the last reuses every step; further is refused.
    SELECT coalesce(max(step_id) + 1, 0) AS steps FROM operation_outputs WHERE execution_id = %(source)s
), source AS (
    SELECT found.* FROM found, recorded WHERE %(from_step)s <= recorded.steps
), forked AS (
    SELECT i.id, i.name
    FROM source, LATERAL insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', %(id)s::text, 'name', source.name, 'queue', source.queue, 'priority', source.priority,
        'input', source.input, 'max_recoveries', source.max_recoveries, 'timeout_seconds', source.timeout_seconds,
        'concurrency_key', source.concurrency_key, 'trace_context', source.trace_context, 'tags', source.tags,
        'forked_from', source.id)), raise_on_conflict => true) AS i
), copied AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT forked.id, o.step_id, o.step_name, o.output, o.error, o.attempts, 0, o.started_at, o.completed_at
    FROM operation_outputs o, forked
    WHERE o.execution_id = %(source)s AND o.step_id < %(from_step)s
    RETURNING 1
), copied_events AS (
    INSERT INTO workflow_events (execution_id, key, step_id, value, created_at)
    SELECT forked.id, ev.key, ev.step_id, ev.value, ev.created_at
    FROM workflow_events ev, forked
    WHERE ev.execution_id = %(source)s AND ev.step_id < %(from_step)s
), copied_streams AS (
    INSERT INTO workflow_streams (execution_id, key, step_id, value, closed, created_at)
    SELECT forked.id, st.key, st.step_id, st.value, st.closed, st.created_at
    FROM workflow_streams st, forked
    WHERE st.execution_id = %(source)s AND st.step_id < %(from_step)s
)
SELECT (SELECT id FROM forked) AS id, (SELECT name FROM forked) AS name, (SELECT count(*) FROM copied) AS copied,
       EXISTS (SELECT 1 FROM found) AS source_found, (SELECT steps FROM recorded) AS recorded_steps;

-- name: write_stream
-- pgdurable.write_stream / close_stream: store the value (or the close, %(value)s NULL) and record the step
-- in one statement, fenced like every step, so a value is written exactly once: a replay finds the step.
WITH owned AS (
    SELECT id FROM workflow_executions
    WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
    FOR SHARE
), recorded AS (
    INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT owned.id, %(step_id)s, %(step_name)s, 'null', NULL, 1, %(attempt)s, %(started_at)s, clock_now()
    FROM owned
    ON CONFLICT (execution_id, step_id) DO NOTHING
    RETURNING execution_id, completed_at
), written AS (
    INSERT INTO workflow_streams (execution_id, key, step_id, value, closed, created_at)
    SELECT execution_id, %(key)s, %(step_id)s, %(value)s::jsonb, %(value)s::jsonb IS NULL, completed_at
    FROM recorded
    RETURNING 1
)
SELECT count(*) FROM written;

-- name: read_stream
-- Whether the execution has finished, and its stream's values after step %(after)s in order (at most
-- %(limit)s; one row with a NULL step_id when there are none), in one snapshot: a stream read together with
-- "finished" holds every value ever written. No row at all: there is no such execution.
SELECT e.status IN ('succeeded', 'failed', 'cancelled') AS ended, st.step_id, st.value::text AS value,
       coalesce(st.closed, false) AS closed
FROM workflow_executions e
LEFT JOIN LATERAL (
    SELECT s.step_id, s.value, s.closed FROM workflow_streams s
    WHERE s.execution_id = e.id AND s.key = %(key)s AND s.step_id > %(after)s
    ORDER BY s.step_id
    LIMIT %(limit)s
) AS st ON true
WHERE e.id = %(id)s
ORDER BY st.step_id;

-- name: list_streams
-- An execution's streams (the first %(limit)s keys): each key with how many values it has, whether it is
-- closed, and its last write.
SELECT key, count(*) FILTER (WHERE NOT closed) AS values, bool_or(closed) AS closed, max(created_at) AS last_at
FROM workflow_streams
WHERE execution_id = %(id)s
GROUP BY key
ORDER BY key
LIMIT %(limit)s;

-- name: park
-- An execution whose recorded history this worker's code does not replay: out of the claim index and of
-- the timer's reach (waiting, available_at NULL) until a worker of the version that recorded it starts or
-- its version is migrated; fenced like a completion. It goes back to %(previous)s (the version it had
-- before this attempt's claim, if any). Nothing else is written: no step, no output.
UPDATE workflow_executions
SET status = 'waiting', owner_id = NULL, lease_expires = NULL, wait_reason = 'parked', available_at = NULL,
    parked_reason = %(reason)s, app_version = coalesce(%(previous)s, app_version), updated_at = now()
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running' AND (lease_expires > now()) IS TRUE
RETURNING id;

-- name: unpark
-- A worker starting: re-enqueue the parked executions of its version that it knows (through the timer's
-- index: parked rows are the waiting ones with no wake-up time).
UPDATE workflow_executions
SET status = 'enqueued', wait_reason = NULL, parked_reason = NULL, available_at = now(), updated_at = now()
WHERE status = 'waiting' AND available_at IS NULL AND wait_reason = 'parked'
  AND app_version = %(version)s AND name = ANY (%(names)s)
RETURNING id;

-- name: app_versions
SELECT app_version, enqueued, waiting, running, parked, live_workers FROM app_versions();

-- name: migrate_app_version
SELECT migrate_app_version(%(old)s, %(new)s);
