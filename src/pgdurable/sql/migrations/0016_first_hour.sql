-- pgdurable schema, version 16: a worker is live while its heartbeats are recent for its own lease.
--
-- Workers heartbeat every third of their lease. Until now a worker counted as live for two minutes after its
-- last heartbeat whatever its lease, so a SIGKILLed worker was listed live (and its queues served) for two
-- minutes. A worker now records its lease, and is live while its last heartbeat is younger than two leases
-- (60 s with the default 30 s lease); a worker of an older version records none: two minutes, as before.
-- worker_alive() says it once, for the views, functions and queries that ask which workers are live.
ALTER TABLE workers ADD COLUMN lease_seconds double precision CHECK (lease_seconds > 0);

-- A worker is live while its last heartbeat is younger than two of its leases (two minutes when unknown).
CREATE FUNCTION worker_alive(heartbeat_at timestamptz, lease_seconds double precision) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT heartbeat_at > now() - make_interval(secs => least(2 * coalesce(lease_seconds, 60), 86400))
$$;
REVOKE ALL ON FUNCTION worker_alive(timestamptz, double precision) FROM PUBLIC;  -- workers' (and owners') only

CREATE OR REPLACE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN e.status = 'waiting'
            THEN 'parked: ' || coalesce(e.parked_reason, 'its history does not replay on the code that claimed it')
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker serves queue ' || e.queue
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                               AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
            ELSE 'no live worker runs application version ' || e.app_version || ' or adopts other versions'
       END AS reason
FROM workflow_executions e
WHERE (e.status = 'enqueued'
       AND NOT EXISTS (SELECT 1 FROM workers w
                       WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                         AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version
                              OR w.adopt_after_seconds IS NOT NULL)
                         AND worker_alive(w.heartbeat_at, w.lease_seconds)))
   OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL);

CREATE OR REPLACE FUNCTION app_versions()
RETURNS TABLE (app_version text, enqueued bigint, waiting bigint, running bigint, parked bigint,
               live_workers bigint)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    WITH unfinished AS (
        SELECT e.app_version,
               count(*) FILTER (WHERE e.status = 'enqueued') AS enqueued,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason IS DISTINCT FROM 'parked') AS waiting,
               count(*) FILTER (WHERE e.status = 'running') AS running,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason = 'parked') AS parked
        FROM workflow_executions e
        WHERE e.status IN ('enqueued', 'waiting', 'running') AND e.app_version IS NOT NULL
        GROUP BY e.app_version
    ), live AS (
        SELECT w.app_version, count(*) AS live_workers
        FROM workers w
        WHERE w.app_version IS NOT NULL AND worker_alive(w.heartbeat_at, w.lease_seconds)
        GROUP BY w.app_version
    )
    SELECT coalesce(u.app_version, l.app_version), coalesce(u.enqueued, 0), coalesce(u.waiting, 0),
           coalesce(u.running, 0), coalesce(u.parked, 0), coalesce(l.live_workers, 0)
    FROM unfinished u FULL JOIN live l ON l.app_version = u.app_version
    ORDER BY 1;
$$;
