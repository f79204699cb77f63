-- Named queries on the worker registry.

-- name: register_worker
INSERT INTO workers (id, hostname, pid, queues, workflows, concurrency, app_version, adopt_after_seconds,
                     lease_seconds)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(workflows)s, %(concurrency)s, %(version)s, %(adopt)s,
        %(lease)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now();

-- name: worker_heartbeat
UPDATE workers SET heartbeat_at = now() WHERE id = %(id)s;

-- name: deregister_worker
WITH bells AS (DELETE FROM worker_doorbells WHERE worker_id = %(id)s)
DELETE FROM workers WHERE id = %(id)s;

-- name: prune_workers
-- Forget workers that stopped heartbeating long ago (they crashed; their leases are swept separately), and
-- their doorbells.
WITH gone AS (DELETE FROM workers WHERE heartbeat_at < now() - interval '1 hour' RETURNING id)
DELETE FROM worker_doorbells WHERE worker_id IN (SELECT id FROM gone);

-- name: arm_doorbell
-- The worker is about to sleep on this queue: the next enqueue into it notifies (ring_doorbells).
-- A bell already armed is left alone and unlocked: an enqueue rings with FOR UPDATE SKIP LOCKED, and a bell
-- locked by a needless re-arming (the worker re-arms after any NOTIFY for the queue, even one for work it
-- had already claimed) would be skipped, its ring lost.
WITH armed AS (
    UPDATE worker_doorbells SET armed = true WHERE queue = %(queue)s AND worker_id = %(id)s AND NOT armed
)
INSERT INTO worker_doorbells (queue, worker_id)
SELECT %(queue)s, %(id)s
WHERE NOT EXISTS (SELECT FROM worker_doorbells WHERE queue = %(queue)s AND worker_id = %(id)s)
ON CONFLICT DO NOTHING;

-- name: list_workers
SELECT id, hostname, pid, queues, workflows, concurrency, started_at, heartbeat_at,
       worker_alive(heartbeat_at, lease_seconds) AS alive, app_version
FROM workers
ORDER BY started_at;

-- name: list_unrunnable
SELECT id, name, queue, created_at, reason FROM unrunnable_executions ORDER BY created_at LIMIT %(limit)s;

-- name: try_leadership
-- The leader's session-level advisory lock, keyed on the schema: held until released or the session ends.
SELECT pg_try_advisory_lock(hashtextextended('pgdurable leader ' || %(schema)s, 0));

-- name: holds_leadership
SELECT EXISTS (
    SELECT FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid() AND granted
      AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('pgdurable leader ' || %(schema)s, 0));

