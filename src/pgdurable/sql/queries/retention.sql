-- Retention: deleting finished executions and what belongs to them (step outputs, messages sent to them,
-- events they published), in small batches.
--
-- What may be deleted (cleanup_count and cleanup_batch agree): an execution with one of the given statuses,
-- which must be finished -- checked here too, so an unfinished (enqueued, waiting, running) execution is
-- never deleted whatever a caller passes -- created and finished before the cutoff, and not the child of
-- an unfinished parent (a parent waiting on its children reads their outcomes; a deleted child would fail
-- it). The parent is looked up by primary key, per candidate that has one (a correlated subquery: NOT
-- EXISTS could be planned as an anti join over every unfinished execution).

-- name: cleanup_cutoff
-- The cutoff on durable time (the executions' times are), computed once per run so that the count and
-- every batch agree.
SELECT clock_now() - make_interval(secs => %(older_than)s);

-- name: cleanup_count
SELECT count(*)
FROM workflow_executions e
WHERE e.created_at < %(cutoff)s
  AND coalesce(e.completed_at, e.updated_at) < %(cutoff)s
  AND e.status = ANY (%(statuses)s)
  AND e.status IN ('succeeded', 'failed', 'cancelled')
  AND (e.parent_id IS NULL
       OR NOT coalesce((SELECT p.status IN ('enqueued', 'waiting', 'running')
                        FROM workflow_executions p WHERE p.id = e.parent_id), false));

-- name: cleanup_batch
-- One batch, one short transaction: take up to %(limit)s deletable executions, oldest first along the
-- created_at index, skipping rows another transaction holds (SKIP LOCKED: a resume or a concurrent cleanup
-- is never waited for), and delete them with their step outputs, messages, events and streams. The status is
-- re-checked on the locked row, so nothing that may still run is deleted. The messages go along the
-- (destination_id, idempotency_key) unique index, the events along their primary key.
WITH doomed AS (
    SELECT e.id
    FROM workflow_executions e
    WHERE e.created_at < %(cutoff)s
      AND coalesce(e.completed_at, e.updated_at) < %(cutoff)s
      AND e.status = ANY (%(statuses)s)
      AND e.status IN ('succeeded', 'failed', 'cancelled')
      AND (e.parent_id IS NULL
           OR NOT coalesce((SELECT p.status IN ('enqueued', 'waiting', 'running')
                            FROM workflow_executions p WHERE p.id = e.parent_id), false))
    ORDER BY e.created_at
    LIMIT %(limit)s
    FOR UPDATE OF e SKIP LOCKED
),
steps AS (
    DELETE FROM operation_outputs o USING doomed d WHERE o.execution_id = d.id RETURNING 1
),
messages AS (
    DELETE FROM workflow_messages m USING doomed d WHERE m.destination_id = d.id RETURNING 1
),
events AS (
    DELETE FROM workflow_events v USING doomed d WHERE v.execution_id = d.id RETURNING 1
),
streams AS (
    DELETE FROM workflow_streams st USING doomed d WHERE st.execution_id = d.id
),
executions AS (
    DELETE FROM workflow_executions e USING doomed d WHERE e.id = d.id RETURNING 1
)
SELECT (SELECT count(*) FROM executions) AS executions, (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM messages) AS messages, (SELECT count(*) FROM events) AS events;
