-- Named queries on cron schedules (migration 0004). The connection's search_path is the pgdurable schema.
-- The firing path reads the time as clock_now() (now(), unless a test moves it with pgdurable.fake_now).

-- name: database_now
SELECT clock_now();

-- name: upsert_schedule
-- Create or redefine a schedule. next_fire_at (the first tick after now, computed by the caller from the
-- database's clock) replaces the stored one only when the timetable changed or the schedule had been paused
-- for an invalid row; otherwise redefining (a worker restart re-declaring its schedules) keeps the next tick
-- as it was. An operator's pause survives a redefinition; a pause for an invalid row does not.
-- An unchanged definition is left alone (no write, no updated_at bump).
WITH upserted AS (
    INSERT INTO schedules AS s (name, workflow_name, cron, timezone, queue, priority, max_recoveries, args,
                                pass_scheduled_at, catch_up, next_fire_at, timeout_seconds)
    VALUES (%(name)s, %(workflow_name)s, %(cron)s, %(timezone)s, %(queue)s, %(priority)s, %(max_recoveries)s,
            %(args)s::jsonb, %(pass_scheduled_at)s, %(catch_up)s, %(next_fire_at)s, %(timeout_seconds)s)
    ON CONFLICT (name) DO UPDATE
    SET workflow_name = excluded.workflow_name, cron = excluded.cron, timezone = excluded.timezone,
        queue = excluded.queue, priority = excluded.priority, max_recoveries = excluded.max_recoveries,
        args = excluded.args, pass_scheduled_at = excluded.pass_scheduled_at, catch_up = excluded.catch_up,
        timeout_seconds = excluded.timeout_seconds,
        next_fire_at = CASE WHEN s.cron IS DISTINCT FROM excluded.cron
                                 OR s.timezone IS DISTINCT FROM excluded.timezone
                                 OR s.last_error IS NOT NULL OR s.next_fire_at IS NULL
                            THEN excluded.next_fire_at ELSE s.next_fire_at END,
        paused = s.paused AND s.last_error IS NULL,
        last_error = NULL,
        updated_at = now()
    WHERE (s.workflow_name, s.cron, s.timezone, s.queue, s.priority, s.max_recoveries, s.args,
           s.pass_scheduled_at, s.catch_up, s.timeout_seconds)
          IS DISTINCT FROM
          (excluded.workflow_name, excluded.cron, excluded.timezone, excluded.queue, excluded.priority,
           excluded.max_recoveries, excluded.args, excluded.pass_scheduled_at, excluded.catch_up,
           excluded.timeout_seconds)
       OR s.last_error IS NOT NULL OR s.next_fire_at IS NULL
    RETURNING s.name, s.workflow_name, s.cron, s.timezone, s.queue, s.priority, s.max_recoveries, s.args,
              s.pass_scheduled_at, s.catch_up, s.paused, s.next_fire_at, s.last_fired_at, s.last_error,
              s.created_at, s.updated_at
)
SELECT * FROM upserted
UNION ALL
SELECT name, workflow_name, cron, timezone, queue, priority, max_recoveries, args, pass_scheduled_at,
       catch_up, paused, next_fire_at, last_fired_at, last_error, created_at, updated_at
FROM schedules
WHERE name = %(name)s AND NOT EXISTS (SELECT 1 FROM upserted);

-- name: get_schedule
SELECT name, workflow_name, cron, timezone, queue, priority, max_recoveries, args, pass_scheduled_at,
       catch_up, paused, next_fire_at, last_fired_at, last_error, created_at, updated_at
FROM schedules
WHERE name = %(name)s;

-- name: list_schedules
SELECT name, workflow_name, cron, timezone, queue, priority, max_recoveries, args, pass_scheduled_at,
       catch_up, paused, next_fire_at, last_fired_at, last_error, created_at, updated_at
FROM schedules
ORDER BY name;

-- name: lock_schedule
-- The database's time and one schedule's timetable, locked until the caller's transaction ends.
SELECT clock_now() AS now, cron, timezone, paused FROM schedules WHERE name = %(name)s FOR UPDATE;

-- name: delete_schedule
DELETE FROM schedules WHERE name = %(name)s RETURNING name;

-- name: pause_schedule
UPDATE schedules SET paused = true, updated_at = now() WHERE name = %(name)s RETURNING name;

-- name: resume_schedule
-- A paused schedule restarts from %(next_fire_at)s (the first tick after now): the ticks it missed while
-- paused do not fire. Resuming an active schedule changes nothing.
UPDATE schedules
SET next_fire_at = CASE WHEN paused THEN %(next_fire_at)s ELSE next_fire_at END,
    updated_at = CASE WHEN paused THEN now() ELSE updated_at END,
    paused = false, last_error = NULL
WHERE name = %(name)s
RETURNING name;

-- name: seconds_until_due
-- How long until the earliest active schedule is due, by the database's clock: 0 or less when one is due
-- now (or has no next_fire_at yet), NULL when there is no active schedule.
SELECT CASE WHEN next_fire_at IS NULL THEN 0 ELSE extract(epoch FROM next_fire_at - clock_now())::float8 END
FROM schedules
WHERE NOT paused
ORDER BY next_fire_at NULLS FIRST
LIMIT 1;

-- name: lock_due_schedules
-- The due schedules, locked for this firing transaction. SKIP LOCKED: a schedule another worker is firing
-- right now is left to it (and once that commits, its next_fire_at is no longer due).
WITH clock AS MATERIALIZED (
    SELECT clock_now() AS now
)
SELECT clock.now, name, cron, timezone, catch_up, next_fire_at
FROM schedules, clock
WHERE NOT paused AND (next_fire_at IS NULL OR next_fire_at <= clock.now)
ORDER BY next_fire_at NULLS FIRST
LIMIT %(limit)s
FOR UPDATE OF schedules SKIP LOCKED;

-- name: enqueue_ticks
-- One execution per tick, from one JSON array of [execution_id, schedule_name, tick]. The id is
-- deterministic ("sched:<name>:<tick>"), so a tick that was already enqueued is not enqueued again.
SELECT i.id
FROM insert_executions_v2(
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'id', r.tick ->> 0, 'name', s.workflow_name, 'queue', s.queue, 'priority', s.priority,
                'input', CASE WHEN s.pass_scheduled_at THEN s.args || jsonb_build_object('scheduled_at', r.tick ->> 2)
                              ELSE s.args END,
                'max_recoveries', s.max_recoveries, 'timeout_seconds', s.timeout_seconds) ORDER BY r.n), '[]')
     FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS r (tick, n)
     JOIN schedules s ON s.name = r.tick ->> 1)) AS i;

-- name: squatted_ticks
-- Of ticks that enqueue_ticks did not enqueue (their id was taken), from one JSON array of
-- [execution_id, schedule_name, tick]: those whose id is held by an execution that no firing of this tick
-- created, because it runs another workflow or was created before the tick was due (a firing enqueues a
-- tick at or after its time, by the database's clock). Such a row suppresses the tick.
SELECT r.tick ->> 1 AS schedule_name, e.id AS execution_id, e.name AS workflow_name, e.created_at
FROM jsonb_array_elements(%(rows)s::jsonb) AS r (tick)
JOIN schedules s ON s.name = r.tick ->> 1
JOIN workflow_executions e ON e.id = r.tick ->> 0
WHERE e.name <> s.workflow_name OR e.created_at < (r.tick ->> 2)::timestamptz
ORDER BY 1, 2;

-- name: advance_schedules
-- From one JSON array of [schedule_name, next_fire_at, last_fired_at or null].
UPDATE schedules s
SET next_fire_at = (r ->> 1)::timestamptz,
    last_fired_at = coalesce((r ->> 2)::timestamptz, s.last_fired_at)
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
WHERE s.name = r ->> 0;

-- name: pause_invalid_schedules
-- From one JSON array of [schedule_name, error message].
UPDATE schedules s
SET paused = true, last_error = r ->> 1, updated_at = now()
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
WHERE s.name = r ->> 0;
