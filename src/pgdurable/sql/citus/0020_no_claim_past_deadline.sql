-- The Citus layout, version 20 (recorded in schema_migrations as 10020): a claim never starts an execution
-- whose deadline has passed.
--
-- On a single node the deadline check fails a parent and the children that inherited its deadline in one
-- statement. On the cluster it goes bucket by bucket (0019), so a child in an earlier bucket can fail first and
-- wake its parent, which a worker then claimed and ran before the parent's own bucket was checked: the parent
-- ended failed with its child's timeout instead of its own (the fault-injection suite's timeout scenario, CI
-- of 2026-12-02). An enqueued execution past its deadline now stays unclaimed until the deadline check of its
-- bucket fails it with pgdurable.WorkflowTimeout, as it would have been had the buckets been checked at once.
-- The function keeps its signature; its body is 0018's with the one condition added.

CREATE OR REPLACE FUNCTION citus_claim(b smallint, queue_name text, names text[], owner text, lease double precision,
                            max_claims integer, version text, adopt double precision)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean,
               previous_version text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    -- durable time as seconds: Citus refuses timestamptz + interval (STABLE) inside CASE
    at_epoch double precision := extract(epoch FROM at);
    lease_until timestamptz := now() + make_interval(secs => lease);
    live_versions text[];
BEGIN
    IF adopt IS NOT NULL THEN
        SELECT coalesce(array_agg(DISTINCT w.app_version), '{}') INTO live_versions FROM workers w
        WHERE w.app_version IS NOT NULL AND w.heartbeat_at > now() - make_interval(secs => adopt);
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT e.id, e.app_version AS previous_version
        FROM workflow_executions e
        WHERE e.bucket = b AND e.status = 'enqueued' AND e.queue = queue_name AND e.name = ANY (names)
          AND e.available_at <= at
          AND (e.deadline IS NULL OR e.deadline > at)  -- past it: the deadline check fails it, never a run
          AND (e.app_version IS NULL OR e.app_version = version
               OR (adopt IS NOT NULL AND NOT e.app_version = ANY (live_versions)))
        ORDER BY e.priority, e.seq
        LIMIT max_claims
        FOR UPDATE SKIP LOCKED
    )
    UPDATE workflow_executions e
    SET status = 'running', owner_id = owner, lease_expires = lease_until, attempt = e.attempt + 1,
        started_at = coalesce(e.started_at, at), updated_at = at, app_version = version, wait_reason = NULL,
        deadline = CASE WHEN e.timeout_seconds IS NOT NULL AND (e.deadline IS NULL OR e.started_at IS NULL)
                        THEN least(coalesce(e.deadline, 'infinity'),
                                   to_timestamp(at_epoch + least(e.timeout_seconds, 315360000)))
                        ELSE e.deadline END
    FROM picked
    WHERE e.bucket = b AND e.id = picked.id
    RETURNING e.id, e.name, e.attempt, e.input, at, e.attempt > 1 OR e.forked_from IS NOT NULL,
              picked.previous_version;
END;
$$;
