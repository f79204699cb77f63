-- Read-only queries for the dashboard and `pgdurable status`. Names start with "dash_" so they never clash
-- with the engine's. Every query here must stay cheap on a table of millions of rows: it either follows
-- an index (the claim index for enqueued rows, the lease index for running rows, the wake-up index for
-- waiting rows, created_at for listing, the parent index for children) or reads catalog statistics. Lists
-- hanging off one execution (children, messages, events) are capped.

-- name: dash_now
-- Durable time, the time executions are recorded in.
SELECT clock_now();

-- name: dash_queues
-- Per queue: enqueued executions that are due (ready) and not yet due (delayed: only rows written before
-- delayed starts waited in 'waiting', or by hand), running ones, leases expired for longer than %(stale)s
-- seconds (nobody is sweeping), the age of the oldest ready execution, live workers serving it, and waiting
-- executions by what they wait for, with those whose wake-up time passed over %(stale)s seconds ago
-- (overdue: no worker's timer is running). Each aggregate reads one status, so it follows that status's
-- partial index. Availability is durable time (clock), leases and heartbeats liveness time (now()).
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
),
enqueued AS (
    SELECT queue,
           count(*) FILTER (WHERE available_at <= (SELECT now FROM clock)) AS ready,
           count(*) FILTER (WHERE available_at > (SELECT now FROM clock)) AS delayed,
           min(available_at) FILTER (WHERE available_at <= (SELECT now FROM clock)) AS oldest_ready
    FROM workflow_executions
    WHERE status = 'enqueued'
    GROUP BY queue
),
running AS (
    SELECT queue, count(*) AS running,
           count(*) FILTER (WHERE lease_expires < now() - make_interval(secs => %(stale)s)) AS stale
    FROM workflow_executions
    WHERE status = 'running'
    GROUP BY queue
),
waiting AS (
    SELECT queue, count(*) AS waiting,
           count(*) FILTER (WHERE wait_reason = 'delay') AS delay,
           count(*) FILTER (WHERE wait_reason = 'sleep') AS sleep,
           count(*) FILTER (WHERE starts_with(wait_reason, 'recv:')) AS recv,
           count(*) FILTER (WHERE wait_reason = 'children') AS children,
           count(*) FILTER (WHERE wait_reason = 'parked') AS parked,
           count(*) FILTER (WHERE available_at < (SELECT now FROM clock) - make_interval(secs => %(stale)s)) AS overdue
    FROM workflow_executions
    WHERE status = 'waiting'
    GROUP BY queue
),
served AS (
    SELECT q AS queue, count(*) AS workers
    FROM workers, unnest(queues) AS q
    WHERE worker_alive(heartbeat_at, lease_seconds)
    GROUP BY q
),
names AS (
    SELECT queue FROM enqueued UNION SELECT queue FROM running UNION SELECT queue FROM waiting
    UNION SELECT queue FROM served
)
SELECT n.queue, coalesce(e.ready, 0) AS ready, coalesce(e.delayed, 0) AS delayed,
       coalesce(r.running, 0) AS running, coalesce(r.stale, 0) AS stale,
       (extract(epoch FROM (SELECT now FROM clock)) - extract(epoch FROM e.oldest_ready))::float8
           AS oldest_ready_seconds,
       coalesce(s.workers, 0) AS live_workers, coalesce(w.waiting, 0) AS waiting,
       coalesce(w.delay, 0) AS delay, coalesce(w.sleep, 0) AS sleep, coalesce(w.recv, 0) AS recv,
       coalesce(w.children, 0) AS children, coalesce(w.parked, 0) AS parked, coalesce(w.overdue, 0) AS overdue
FROM names n
LEFT JOIN enqueued e USING (queue)
LEFT JOIN running r USING (queue)
LEFT JOIN waiting w USING (queue)
LEFT JOIN served s USING (queue)
ORDER BY n.queue;

-- name: dash_outcomes
-- Executions that finished in the last %(window)s seconds, per %(bucket)s-second bucket (0 = the newest)
-- and status. completed_at has no index on purpose (an indexed completed_at would make every completion a
-- non-HOT update), so the scan is bounded by created_at: executions created more than %(lookback)s seconds
-- ago are left out of the chart. (completed_at <= now: a time in the future, even infinity, is no bucket.)
-- On durable time, like the times it compares.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
)
SELECT floor(extract(epoch FROM clock.now - completed_at) / %(bucket)s)::int AS ago, status, count(*) AS n
FROM workflow_executions, clock
WHERE created_at > clock.now - make_interval(secs => %(lookback)s)
  AND completed_at > clock.now - make_interval(secs => %(window)s) AND completed_at <= clock.now
GROUP BY 1, 2;

-- name: dash_estimated_rows
-- The planner's estimate of the executions stored (-1: never analyzed): exact counts of a large table are
-- a full scan.
SELECT c.reltuples::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'workflow_executions';

-- name: dash_count_capped
-- An exact count that stops at %(cap)s rows: cheap on a small table, bounded on a large one.
SELECT count(*) FROM (SELECT 1 FROM workflow_executions LIMIT %(cap)s) AS capped;

-- name: dash_list_older
-- One page of executions, newest first, strictly older than the cursor (created_at, id). The first page is
-- dash_list_first. The row comparison is an index condition on created_at, so a page
-- costs the same at row 50 and at row 5,000,000 (no OFFSET); ties on created_at (a bulk enqueue shares its
-- transaction's time) are broken by id.
SELECT id, name, queue, status, attempt, created_at, started_at, completed_at,
       error ->> 'type' AS error_type, left(error ->> 'message', 300) AS error_message, wait_reason
FROM workflow_executions
WHERE (created_at, id) < (%(at)s::timestamptz, %(id)s::text)
  AND created_at >= %(since)s::timestamptz AND created_at <= %(until)s::timestamptz
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(id, %(prefix)s::text))
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: dash_list_first
-- The first page, newest first: dash_list_older without a cursor (a cursor of ('infinity', '') would leave
-- out rows created at infinity).
SELECT id, name, queue, status, attempt, created_at, started_at, completed_at,
       error ->> 'type' AS error_type, left(error ->> 'message', 300) AS error_message, wait_reason
FROM workflow_executions
WHERE created_at >= %(since)s::timestamptz AND created_at <= %(until)s::timestamptz
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(id, %(prefix)s::text))
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: dash_list_newer
-- The page just newer than the cursor, oldest first (the caller reverses it).
SELECT id, name, queue, status, attempt, created_at, started_at, completed_at,
       error ->> 'type' AS error_type, left(error ->> 'message', 300) AS error_message, wait_reason
FROM workflow_executions
WHERE (created_at, id) > (%(at)s::timestamptz, %(id)s::text)
  AND created_at >= %(since)s::timestamptz AND created_at <= %(until)s::timestamptz
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(id, %(prefix)s::text))
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: dash_exists
SELECT id FROM workflow_executions WHERE id = %(id)s;

-- name: dash_execution
-- One execution: every column but the payloads as one JSON object (columns added by later migrations show
-- up without a change here; the trace context as its text, cut, so no stored JSON nests in it), then the output (cut to %(max)s characters) with its full size, the error,
-- and its parent's name and status.
SELECT to_jsonb(e) - 'input' - 'output' - 'error' - 'trace_context'
         || jsonb_build_object('trace_context', left(e.trace_context::text, 2000)) AS fields,
       left(e.output::text, %(max)s) AS output, octet_length(e.output::text) AS output_size, e.error::text AS error,
       p.name AS parent_name, p.status AS parent_status
FROM workflow_executions e
LEFT JOIN workflow_executions p ON p.id = e.parent_id
WHERE e.id = %(id)s;

-- name: dash_input
SELECT left(input::text, %(max)s) AS text, octet_length(input::text) AS size FROM workflow_executions WHERE id = %(id)s;

-- name: dash_payload
-- The whole stored payload, for the raw view.
SELECT CASE %(column)s WHEN 'input' THEN input::text WHEN 'output' THEN output::text
                       WHEN 'error' THEN error::text END
FROM workflow_executions
WHERE id = %(id)s;

-- name: dash_steps
-- The recorded steps of one execution in order, every column but the payloads as JSON (step kinds added
-- later, such as sleeps and waits, come along), the output cut to %(max)s characters, and the error.
SELECT to_jsonb(o) - 'execution_id' - 'output' - 'error' AS fields,
       left(o.output::text, %(max)s) AS output, octet_length(o.output::text) AS output_size, o.error::text AS error
FROM operation_outputs o
WHERE o.execution_id = %(id)s
ORDER BY o.step_id
LIMIT %(limit)s;

-- name: dash_children_counts
-- A parent's children by status, counting at most %(cap)s of them (a fan-out of millions stays cheap).
SELECT status, count(*) AS n
FROM (SELECT status FROM workflow_executions WHERE parent_id = %(id)s LIMIT %(cap)s) AS c
GROUP BY status;

-- name: dash_children
-- The first %(limit)s children in creation order, among the first %(cap)s the parent index yields.
SELECT id, name, status, wait_reason, available_at, created_at, completed_at
FROM (SELECT id, name, status, wait_reason, available_at, created_at, completed_at
      FROM workflow_executions WHERE parent_id = %(id)s LIMIT %(cap)s) AS c
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: dash_message_counts
-- Messages sent to an execution, and how many wait to be received, counting at most %(cap)s.
SELECT count(*) AS total, count(*) FILTER (WHERE consumed_at IS NULL) AS pending
FROM (SELECT consumed_at FROM workflow_messages WHERE destination_id = %(id)s LIMIT %(cap)s) AS m;

-- name: dash_messages
-- The newest %(limit)s messages sent to an execution (consumed or not), among the first %(cap)s found along
-- the (destination_id, idempotency_key) unique index; values cut to %(max)s characters. (The subquery keeps
-- the planner from walking the primary key backwards in search of this destination's rows.)
SELECT id, topic, left(message::text, %(max)s) AS text, octet_length(message::text) AS size, idempotency_key,
       created_at, consumed_at, consumed_by_step
FROM (SELECT id, topic, message, idempotency_key, created_at, consumed_at, consumed_by_step
      FROM workflow_messages WHERE destination_id = %(id)s LIMIT %(cap)s) AS m
ORDER BY id DESC
LIMIT %(limit)s;

-- name: dash_events_latest
-- The current value of each of an execution's event keys (the latest set_event), with how many values the
-- key has had; values cut to %(max)s characters. Walks the primary key (execution_id, key, step_id)
-- backwards: keys in reverse order, each key's latest value first.
SELECT DISTINCT ON (key) key, step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size,
       created_at, count(*) OVER (PARTITION BY key) AS versions
FROM workflow_events
WHERE execution_id = %(id)s
ORDER BY key DESC, step_id DESC
LIMIT %(limit)s;

-- name: dash_stream_values
-- The newest %(limit)s values of one of an execution's streams, cut to %(max)s characters, with their sizes.
-- Walks the primary key (execution_id, key, step_id) backwards.
SELECT step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size, created_at
FROM workflow_streams
WHERE execution_id = %(id)s AND key = %(key)s AND NOT closed
ORDER BY step_id DESC
LIMIT %(limit)s;

-- name: dash_events_history
-- An execution's newest %(limit)s event values, every key, newest first.
SELECT key, step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size, created_at
FROM workflow_events
WHERE execution_id = %(id)s
ORDER BY step_id DESC, key
LIMIT %(limit)s;

-- name: dash_schedules
-- Schedules by name (the primary key), with what the page shows.
SELECT name, workflow_name, cron, timezone, queue, paused, next_fire_at, last_fired_at, last_error, catch_up
FROM schedules
ORDER BY name
LIMIT %(limit)s;

-- name: dash_workers
-- Registered workers, newest heartbeat first; alive as the engine judges it (worker_alive).
SELECT id, hostname, pid, queues, workflows, concurrency, started_at, heartbeat_at,
       worker_alive(heartbeat_at, lease_seconds) AS alive, app_version
FROM workers
ORDER BY alive DESC, started_at;

-- name: dash_unrunnable
SELECT id, name, queue, created_at, reason FROM unrunnable_executions ORDER BY created_at LIMIT %(limit)s;

-- name: dash_known_names
-- Workflow names registered by recent workers: suggestions for the name filter, without scanning executions.
SELECT DISTINCT w FROM workers, unnest(workflows) AS w
WHERE heartbeat_at > now() - interval '1 hour'
ORDER BY w
LIMIT 500;

-- name: dash_unrunnable_count
SELECT count(*) FROM unrunnable_executions;

-- name: dash_tables
-- Size and tuple statistics of pgdurable's tables (dead tuples show vacuum falling behind).
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS total_bytes, pg_relation_size(c.oid) AS table_bytes,
       coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples, s.last_autovacuum,
       s.last_vacuum, coalesce(s.autovacuum_count, 0) AS autovacuum_count
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
ORDER BY pg_total_relation_size(c.oid) DESC;

-- name: dash_server
SELECT current_setting('server_version') AS version, pg_database_size(current_database()) AS database_bytes,
       now() AS now;
