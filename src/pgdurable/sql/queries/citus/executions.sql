-- The Citus layout's versions of named queries (docs/scale-out.md): a schema migrated with the distributed
-- layout runs these instead of the blocks of the same name in ../executions.sql and ../waits.sql (sqlfiles.py,
-- store/calls.py). Every statement on a distributed table names its bucket (bucket_of(id)); work that spans
-- buckets, changes statuses or notifies is done by the Citus layout's PL/pgSQL functions on the coordinator
-- (sql/citus/), whose routed statements each stay in one bucket. A block not overridden here is the
-- single-node one: it either reads across shards without locks or calls a function the layout replaced.

-- name: enqueue
-- Through the layout's insert_executions_v2, which routes the row to its bucket (the single node's plain
-- INSERT names no bucket).
SELECT i.id, i.name, true AS created
FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
    'id', %(id)s::text, 'name', %(name)s::text, 'queue', %(queue)s::text, 'priority', %(priority)s::int,
    'input', %(input)s::jsonb, 'max_recoveries', %(max_recoveries)s::int, 'delay_seconds', %(delay)s::float8,
    'timeout_seconds', %(timeout)s::float8, 'dedup_key', %(dedup_key)s::text,
    'concurrency_key', %(concurrency_key)s::text, 'trace_context', %(trace)s::jsonb,
    'tags', %(tags)s::jsonb))) AS i;

-- name: find_enqueued
-- (Dedup keys are refused on Citus: only the id can have been taken.)
SELECT id, name, false AS created FROM workflow_executions WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: start_owned
SELECT id, name, created, attempt, input, db_now, owned
FROM citus_start_owned(%(id)s, %(name)s, %(queue)s, %(priority)s, %(input)s::jsonb, %(max_recoveries)s,
                       %(timeout)s, %(trace)s::jsonb, %(tags)s::jsonb, %(owner)s, %(lease)s, %(version)s);

-- name: claim
-- One bucket's claim; the producer rotates over the buckets.
SELECT * FROM citus_claim(%(bucket)s::smallint, %(queue)s, %(names)s, %(owner)s, %(lease)s, %(limit)s,
                          %(version)s, %(adopt)s::float8);

-- name: load_steps
SELECT execution_id, step_id, step_name, output, error FROM citus_load_steps(%(ids)s);

-- name: write_steps
SELECT execution_id, recorded_by_attempt, step_id FROM citus_write_steps(%(rows)s::jsonb);

-- name: write_completions
SELECT execution_id, attempt, step_id FROM citus_write_completions(%(rows)s::jsonb);

-- name: heartbeat
SELECT id, attempt FROM citus_heartbeat(%(owner)s, %(lease)s, %(ids)s);

-- name: release
SELECT id FROM citus_release(%(owner)s, %(ids)s);

-- name: sweep_expired
SELECT id, status, recoveries FROM citus_sweep_expired();

-- name: fail_unrunnable
SELECT id, name FROM citus_fail_unrunnable(%(grace)s);

-- name: get_execution
SELECT id, name, queue, status, priority, input, output, error, owner_id, lease_expires, attempt,
       recoveries, max_recoveries, available_at, created_at, updated_at, started_at, completed_at,
       wait_reason, parent_id, forked_from, timeout_seconds, deadline, app_version, dedup_key, concurrency_key,
       tags, debounce_key, parked_reason
FROM workflow_executions
WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: get_status
SELECT status, output, error FROM workflow_executions WHERE bucket = bucket_of(%(id)s) AND id = %(id)s;

-- name: await_status
-- One bucket: the execution and its registration live together (a finished one is only read). No snapshot
-- (seen): the layout's completions notify "_done" with the id, never the outcome.
WITH peek AS (
    SELECT status, output, error FROM workflow_executions WHERE bucket = bucket_of(%(id)s) AND id = %(id)s
), locked AS (
    SELECT status, output, error FROM workflow_executions
    WHERE bucket = bucket_of(%(id)s) AND id = %(id)s
      AND NOT EXISTS (SELECT FROM peek WHERE status IN ('succeeded', 'failed', 'cancelled'))
    FOR SHARE
), registered AS (
    INSERT INTO awaited_executions (bucket, execution_id)
    SELECT bucket_of(%(id)s), %(id)s FROM locked WHERE status NOT IN ('succeeded', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
)
SELECT status, output, error, NULL::text AS seen FROM locked
UNION ALL
SELECT status, output, error, NULL FROM peek WHERE NOT EXISTS (SELECT FROM locked);

-- name: set_tags
SELECT citus_set_tags(%(id)s, %(attempt)s, %(step_id)s, %(step_name)s, %(started_at)s, %(tags)s::jsonb);

-- name: list_steps
SELECT step_id, step_name, output, error, attempts, recorded_by_attempt, started_at, completed_at
FROM operation_outputs
WHERE bucket = bucket_of(%(id)s) AND execution_id = %(id)s
ORDER BY step_id;

-- name: resume
SELECT resumed AS id FROM citus_resume(%(id)s);

-- name: unserved
WITH e AS MATERIALIZED (
    SELECT status, queue, name FROM workflow_executions WHERE bucket = bucket_of(%(id)s) AND id = %(id)s
), live AS MATERIALIZED (
    SELECT queues, workflows FROM workers WHERE worker_alive(heartbeat_at, lease_seconds)
)
SELECT e.status, e.queue, e.name,
       EXISTS (SELECT 1 FROM live w WHERE e.queue = ANY (w.queues)) AS served,
       EXISTS (SELECT 1 FROM live w WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)) AS known
FROM e;

-- name: queue_depths
WITH clock AS MATERIALIZED (SELECT clock_now() AS now),
depths AS (
    SELECT queue, status, count(*) AS count, min(available_at) FILTER (WHERE status = 'enqueued') AS oldest
    FROM workflow_executions
    WHERE status IN ('enqueued', 'waiting', 'running')
    GROUP BY queue, status
)
SELECT queue, status, count, extract(epoch FROM clock.now) - extract(epoch FROM oldest) AS oldest_seconds
FROM depths, clock
ORDER BY queue, status;

-- name: fork
SELECT id, name, copied, source_found, recorded_steps FROM citus_fork(%(source)s, %(id)s, %(from_step)s);
