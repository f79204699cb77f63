-- Named queries about Citus (distributed PostgreSQL): see citus.py and docs/scale-out.md.

-- name: citus_installed
-- Whether the connected database has the citus extension (then it is a Citus coordinator or node).
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: citus_defer_propagation
-- For the rest of the migration's transaction: create objects on the coordinator only. Citus otherwise
-- propagates every CREATE FUNCTION to the worker nodes at once, and then refuses a later ALTER FUNCTION ... SET
-- search_path FROM CURRENT on it (migration 0008): "unsupported ALTER FUNCTION ... SET ... FROM CURRENT for a
-- distributed function".
SET LOCAL citus.create_object_propagation = 'deferred';

-- name: citus_layout
-- Whether a schema has the Citus layout: its function citus_buckets() exists (sql/citus/).
SELECT to_regprocedure(%(function)s) IS NOT NULL;

-- name: claimable_buckets
-- On a schema with the Citus layout: the buckets with executions of a queue to claim now, without locks (one
-- scan of every shard). An idle producer visits these before going on with its rotation.
WITH clock AS MATERIALIZED (SELECT clock_now() AS now)
SELECT DISTINCT e.bucket FROM workflow_executions e, clock
WHERE e.status = 'enqueued' AND e.queue = %(queue)s AND e.name = ANY (%(names)s) AND e.available_at <= clock.now
  AND (e.deadline IS NULL OR e.deadline > clock.now)  -- as citus_claim (sql/citus/0020)
ORDER BY 1;

-- The maintenance duties on a schema with the Citus layout: one bucket and at most %(limit)s executions per
-- statement (sql/citus/0019_maintenance_per_bucket.sql), called bucket after bucket by the worker
-- (worker/maintenance/buckets.py), so that a statement cancelled or failing in one bucket leaves the others
-- served.

-- name: citus_sweep_bucket
SELECT id, status, recoveries FROM citus_sweep_bucket(%(bucket)s::smallint, %(limit)s);

-- name: citus_wake_bucket
SELECT woken, next_due, now FROM citus_wake_bucket(%(bucket)s::smallint, %(limit)s);

-- name: citus_expire_bucket
SELECT id FROM citus_expire_bucket(%(bucket)s::smallint, %(limit)s);

-- name: citus_fail_unrunnable_bucket
SELECT id, name FROM citus_fail_unrunnable_bucket(%(bucket)s::smallint, %(grace)s, %(limit)s);

-- name: citus_cleanup_bucket
SELECT executions, steps, messages, events
FROM citus_cleanup_bucket(%(bucket)s::smallint, %(cutoff)s, %(statuses)s, %(limit)s);

-- name: citus_buckets_of
-- The bucket of each execution id (bucket_of is IMMUTABLE: computed on the coordinator, no shard read), so that
-- the worker's group commits and heartbeats go out one bucket per statement.
SELECT id, bucket_of(id) FROM unnest(%(ids)s::text[]) AS id;
