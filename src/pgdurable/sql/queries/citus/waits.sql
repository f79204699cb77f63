-- The Citus layout's versions of the named queries of ../waits.sql (see executions.sql here).

-- name: suspend
UPDATE workflow_executions
SET status = 'waiting', owner_id = NULL, lease_expires = NULL, wait_reason = %(reason)s,
    available_at = CASE WHEN %(wake_at)s::timestamptz > '9999-12-30 00:00:00+00'
                        THEN '9999-12-30 00:00:00+00' ELSE %(wake_at)s::timestamptz END,
    updated_at = clock_now()
WHERE bucket = bucket_of(%(id)s) AND id = %(id)s AND attempt = %(attempt)s AND status = 'running'
  AND lease_expires > now()
  AND (%(wakeups)s::bigint IS NULL OR wakeups = %(wakeups)s::bigint)
RETURNING id;

-- name: wake_due
SELECT woken, next_due, now FROM citus_wake_due();

-- name: expire_deadlines
SELECT id FROM citus_expire_deadlines();

-- name: receive
SELECT owned, wakeups, got AS found, message
FROM citus_receive(%(id)s, %(attempt)s, %(topic)s, %(step_id)s, %(step_name)s, %(started_at)s);

-- name: list_messages
SELECT id, topic, message, idempotency_key, created_at, consumed_at, consumed_by_step
FROM workflow_messages
WHERE bucket = bucket_of(%(id)s) AND destination_id = %(id)s
ORDER BY id;

-- name: set_event
SELECT citus_set_event(%(id)s, %(attempt)s, %(step_id)s, %(step_name)s, %(started_at)s, %(key)s,
                       %(value)s::jsonb);

-- name: get_event
SELECT value::text FROM workflow_events
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s AND key = %(key)s
ORDER BY step_id DESC
LIMIT 1;

-- name: list_events
SELECT key, step_id, value, created_at FROM workflow_events
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s
ORDER BY key, step_id;

-- name: enqueue_child
SELECT recorded, created, found_name AS name, conflict
FROM citus_enqueue_child(%(parent)s, %(attempt)s, %(id)s, %(name)s, %(queue)s, %(priority)s, %(input)s::jsonb,
                         %(max_recoveries)s, %(delay)s, %(timeout)s, %(concurrency_key)s, %(trace)s::jsonb,
                         %(tags)s::jsonb, %(step_id)s, %(step_name)s, %(started_at)s);

-- name: awaited_status
SELECT wakeups, id, status, output, error, is_child FROM citus_awaited_status(%(id)s, %(attempt)s, %(ids)s);

-- name: write_stream
SELECT citus_write_stream(%(id)s, %(attempt)s, %(step_id)s, %(step_name)s, %(started_at)s, %(key)s,
                          %(value)s::jsonb);

-- name: read_stream
SELECT e.status IN ('succeeded', 'failed', 'cancelled') AS ended, st.step_id, st.value::text AS value,
       coalesce(st.closed, false) AS closed
FROM workflow_executions e
LEFT JOIN LATERAL (
    SELECT s.step_id, s.value, s.closed FROM workflow_streams s
    WHERE s.bucket = e.bucket AND s.execution_id = e.id AND s.key = %(key)s AND s.step_id > %(after)s
    ORDER BY s.step_id
    LIMIT %(limit)s
) AS st ON true
WHERE e.bucket = bucket_of(%(id)s) AND e.id = %(id)s
ORDER BY st.step_id;

-- name: list_streams
SELECT key, count(*) FILTER (WHERE NOT closed) AS values, bool_or(closed) AS closed, max(created_at) AS last_at
FROM workflow_streams
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s
GROUP BY key
ORDER BY key
LIMIT %(limit)s;

-- name: park
UPDATE workflow_executions
SET status = 'waiting', owner_id = NULL, lease_expires = NULL, wait_reason = 'parked', available_at = NULL,
    parked_reason = %(reason)s, app_version = coalesce(%(previous)s, app_version), updated_at = now()
WHERE bucket = bucket_of(%(id)s) AND id = %(id)s AND attempt = %(attempt)s AND status = 'running'
  AND lease_expires > now()
RETURNING id;

-- name: unpark
SELECT id FROM citus_unpark(%(version)s, %(names)s);
