-- Retention: deleting finished executions and what belongs to them, in small batches. Tables added later
-- that hang off an execution (messages, events) get one more DELETE ... USING doomed in cleanup_batch.

-- name: cleanup_cutoff
-- The cutoff on database time, computed once per run so that the count and every batch agree.
SELECT now() - make_interval(secs => %(older_than)s);

-- name: cleanup_count
SELECT count(*)
FROM workflow_executions
WHERE created_at < %(cutoff)s
  AND coalesce(completed_at, updated_at) < %(cutoff)s
  AND status = ANY (%(statuses)s);

-- name: cleanup_batch
-- One batch, one short transaction: take up to %(limit)s finished executions that ended before the cutoff,
-- oldest first along the created_at index, skipping rows another transaction holds (SKIP LOCKED: a resume
-- or a concurrent cleanup is never waited for), and delete them with their step outputs. Only terminal
-- statuses are ever passed in, and the status is re-checked on the locked row, so nothing that may still
-- run is deleted.
WITH doomed AS (
    SELECT id
    FROM workflow_executions
    WHERE created_at < %(cutoff)s
      AND coalesce(completed_at, updated_at) < %(cutoff)s
      AND status = ANY (%(statuses)s)
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
steps AS (
    DELETE FROM operation_outputs o USING doomed d WHERE o.execution_id = d.id RETURNING 1
),
executions AS (
    DELETE FROM workflow_executions e USING doomed d WHERE e.id = d.id RETURNING 1
)
SELECT (SELECT count(*) FROM executions), (SELECT count(*) FROM steps);
