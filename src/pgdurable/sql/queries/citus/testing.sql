-- The Citus layout's versions of the named queries of ../testing.sql (see executions.sql here).

-- name: test_clock_idle_until
-- The same answer as on one node, in one aggregate over every shard: the live workers (a coordinator table)
-- and the clock are read first, so the shards are joined with nothing but their values.
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
), live AS MATERIALIZED (
    SELECT coalesce(array_agg(DISTINCT q || E'\n' || n), '{}') AS known
    FROM workers w, unnest(w.queues) AS q, unnest(w.workflows) AS n
    WHERE worker_alive(w.heartbeat_at, w.lease_seconds)
), executions AS MATERIALIZED (
    SELECT coalesce(bool_or(e.status = 'running'), false)
           OR coalesce(bool_or(e.status = 'enqueued' AND e.available_at <= c.now
                               AND (e.queue || E'\n' || e.name) = ANY (l.known)), false)
           OR coalesce(bool_or(e.status = 'waiting' AND e.available_at <= c.now), false)
           OR coalesce(bool_or(e.deadline < c.now), false) AS busy,
           min(CASE WHEN e.status IN ('waiting', 'enqueued') AND e.available_at > c.now THEN e.available_at END)
               AS next_wake,
           min(CASE WHEN e.deadline >= c.now THEN e.deadline END) AS next_deadline
    FROM workflow_executions e, clock c, live l
    WHERE e.status IN ('enqueued', 'waiting', 'running')
), ticks AS MATERIALIZED (
    SELECT coalesce(bool_or(s.next_fire_at IS NULL OR s.next_fire_at <= c.now), false) AS busy,
           min(s.next_fire_at) FILTER (WHERE s.next_fire_at > c.now) AS next_tick
    FROM schedules s, clock c
    WHERE NOT s.paused
)
SELECT CASE WHEN NOT (x.busy OR t.busy)
            THEN least(x.next_wake, t.next_tick, x.next_deadline + interval '1 microsecond') END, c.now
FROM executions x, ticks t, clock c;
