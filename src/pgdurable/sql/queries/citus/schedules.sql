-- The Citus layout's versions of the named queries of ../schedules.sql (see executions.sql here).

-- name: squatted_ticks
-- The ticks (with their schedules, on the coordinator) first; then each looked up in its bucket.
WITH ticks AS MATERIALIZED (
    SELECT r.tick ->> 0 AS id, r.tick ->> 1 AS schedule_name, (r.tick ->> 2)::timestamptz AS tick_at,
           s.workflow_name
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r (tick)
    JOIN schedules s ON s.name = r.tick ->> 1
)
SELECT t.schedule_name, e.id AS execution_id, e.name AS workflow_name, e.created_at
FROM ticks t
JOIN workflow_executions e ON e.bucket = bucket_of(t.id) AND e.id = t.id
WHERE e.name <> t.workflow_name OR e.created_at < t.tick_at
ORDER BY 1, 2;
