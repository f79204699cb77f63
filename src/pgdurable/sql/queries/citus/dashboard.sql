-- The Citus layout's versions of the named queries of ../dashboard.sql (see executions.sql here): an
-- execution's page reads its bucket; the lists and counts read every shard, without locks, as on one node.

-- name: dash_exists
SELECT id FROM workflow_executions WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: dash_execution
-- The parent lives in its own bucket: looked up by a second, separate read.
WITH e AS MATERIALIZED (
    SELECT to_jsonb(e) - 'bucket' - 'input' - 'output' - 'error' - 'trace_context'
             || jsonb_build_object('trace_context', left(e.trace_context::text, 2000)) AS fields,
           left(e.output::text, %(max)s) AS output, octet_length(e.output::text) AS output_size,
           e.error::text AS error, e.parent_id
    FROM workflow_executions e
    WHERE e.bucket = bucket_of(%(id)s) AND e.id = %(id)s
), p AS MATERIALIZED (
    SELECT p.name, p.status FROM workflow_executions p WHERE p.id = (SELECT parent_id FROM e)
)
SELECT e.fields, e.output, e.output_size, e.error, p.name AS parent_name, p.status AS parent_status
FROM e LEFT JOIN p ON true;

-- name: dash_input
SELECT left(input::text, %(max)s) AS text, octet_length(input::text) AS size FROM workflow_executions
WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: dash_payload
SELECT CASE %(column)s WHEN 'input' THEN input::text WHEN 'output' THEN output::text
                       WHEN 'error' THEN error::text END
FROM workflow_executions
WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: dash_steps
SELECT to_jsonb(o) - 'bucket' - 'execution_id' - 'output' - 'error' AS fields,
       left(o.output::text, %(max)s) AS output, octet_length(o.output::text) AS output_size, o.error::text AS error
FROM operation_outputs o
WHERE o.bucket = bucket_of(%(id)s) AND o.execution_id = %(id)s
ORDER BY o.step_id
LIMIT %(limit)s;

-- name: dash_message_counts
SELECT count(*) AS total, count(*) FILTER (WHERE consumed_at IS NULL) AS pending
FROM (SELECT consumed_at FROM workflow_messages
      WHERE bucket = bucket_of(%(id)s) AND destination_id = %(id)s LIMIT %(cap)s) AS m;

-- name: dash_messages
SELECT id, topic, left(message::text, %(max)s) AS text, octet_length(message::text) AS size, idempotency_key,
       created_at, consumed_at, consumed_by_step
FROM (SELECT id, topic, message, idempotency_key, created_at, consumed_at, consumed_by_step
      FROM workflow_messages WHERE bucket = bucket_of(%(id)s) AND destination_id = %(id)s LIMIT %(cap)s) AS m
ORDER BY id DESC
LIMIT %(limit)s;

-- name: dash_events_latest
SELECT DISTINCT ON (key) key, step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size,
       created_at, count(*) OVER (PARTITION BY key) AS versions
FROM workflow_events
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s
ORDER BY key DESC, step_id DESC
LIMIT %(limit)s;

-- name: dash_stream_values
SELECT step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size, created_at
FROM workflow_streams
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s AND key = %(key)s AND NOT closed
ORDER BY step_id DESC
LIMIT %(limit)s;

-- name: dash_events_history
SELECT key, step_id, left(value::text, %(max)s) AS text, octet_length(value::text) AS size, created_at
FROM workflow_events
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s
ORDER BY step_id DESC, key
LIMIT %(limit)s;

-- name: dash_queues
-- Each aggregate over the shards, and the workers (a coordinator table), materialized before they are joined.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
),
enqueued AS MATERIALIZED (
    SELECT queue,
           count(*) FILTER (WHERE available_at <= (SELECT now FROM clock)) AS ready,
           count(*) FILTER (WHERE available_at > (SELECT now FROM clock)) AS delayed,
           min(available_at) FILTER (WHERE available_at <= (SELECT now FROM clock)) AS oldest_ready
    FROM workflow_executions
    WHERE status = 'enqueued'
    GROUP BY queue
),
running AS MATERIALIZED (
    SELECT queue, count(*) AS running,
           count(*) FILTER (WHERE lease_expires < now() - make_interval(secs => %(stale)s)) AS stale
    FROM workflow_executions
    WHERE status = 'running'
    GROUP BY queue
),
waiting AS MATERIALIZED (
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
served AS MATERIALIZED (
    SELECT q AS queue, count(*) AS workers
    FROM workers, unnest(queues) AS q
    WHERE worker_alive(heartbeat_at, lease_seconds)
    GROUP BY q
),
names AS MATERIALIZED (
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
