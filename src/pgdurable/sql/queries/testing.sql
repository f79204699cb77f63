-- Named queries of pgdurable.testing: the time-skipping clock of a private test schema (see "The clock" in
-- schema.sql). Never run on a production schema: the harness runs them only on the schema it created.

-- name: test_clock_enable
-- Durable time follows test_clock from now on, in every session of this schema (a setting of the
-- function itself, so pooled connections and a caller's own transaction see it too).
ALTER FUNCTION clock_now() SET pgdurable.test_clock = 'on';

-- name: test_clock_lock
-- Hold off every writer of executions while the clock is moved: a transaction that read the clock before
-- the jump cannot commit a row timed by it after the jump (an enqueue's delay would end early). Waits at
-- most the lock_timeout the caller set.
LOCK TABLE workflow_executions IN SHARE MODE;

-- name: test_clock_idle_until
-- The durable time the clock may jump to: the earliest timer of the schema (a waiting execution's wake-up, a
-- delayed enqueued one, a schedule's next tick, just past an unfinished execution's deadline), provided
-- that nothing can happen before it: no execution runs, none that a live worker can claim is due, no wake-up,
-- tick or deadline is already due. NULL when something can happen now, or nothing waits on a timer.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), busy AS (
    SELECT EXISTS (SELECT 1 FROM workflow_executions WHERE status = 'running')
        OR EXISTS (SELECT 1 FROM workflow_executions e, clock
                   WHERE e.status = 'enqueued' AND e.available_at <= clock.now
                     AND EXISTS (SELECT 1 FROM workers w
                                 WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                                   AND worker_alive(w.heartbeat_at, w.lease_seconds)))
        OR EXISTS (SELECT 1 FROM workflow_executions e, clock
                   WHERE e.status = 'waiting' AND e.available_at <= clock.now)
        OR EXISTS (SELECT 1 FROM workflow_executions e, clock
                   WHERE e.deadline < clock.now AND e.status IN ('enqueued', 'waiting', 'running'))
        OR EXISTS (SELECT 1 FROM schedules s, clock
                   WHERE NOT s.paused AND (s.next_fire_at IS NULL OR s.next_fire_at <= clock.now)) AS yes
), timers AS (
    SELECT min(e.available_at) AS at FROM workflow_executions e, clock
    WHERE e.status IN ('waiting', 'enqueued') AND e.available_at > clock.now
    UNION ALL
    SELECT min(s.next_fire_at) FROM schedules s, clock
    WHERE NOT s.paused AND s.next_fire_at > clock.now
    UNION ALL
    -- expire_deadlines fails executions whose deadline is strictly before the clock
    SELECT min(e.deadline) + interval '1 microsecond' FROM workflow_executions e, clock
    WHERE e.deadline >= clock.now AND e.status IN ('enqueued', 'waiting', 'running')
)
SELECT CASE WHEN NOT busy.yes THEN (SELECT min(at) FROM timers) END, clock.now
FROM busy, clock;

-- name: test_clock_move_to
-- Move durable time forward to %(at)s (never back); returns the new time.
UPDATE test_clock
SET ahead = ahead + greatest(%(at)s::timestamptz - clock_now(), interval '0')
RETURNING now() + ahead;

-- name: test_clock_advance
-- Move durable time forward by %(seconds)s seconds; returns the new time.
UPDATE test_clock
SET ahead = ahead + make_interval(secs => greatest(%(seconds)s::float8, 0))
RETURNING now() + ahead;

-- name: test_clock_moved
-- Tell the workers' schedulers that schedules may be due (their sleep was timed by the old clock).
SELECT pg_notify(notify_channel('schedules'), '');
