-- pgdurable schema, version 14: a worker is live while its heartbeats are recent for its own lease.
--
-- Workers heartbeat every third of their lease. Until now a worker counted as live for two minutes after its
-- last heartbeat whatever its lease, so a SIGKILLed worker was listed live (and its queues served) for two
-- minutes. A worker now records its lease, and is live while its last heartbeat is younger than two leases
-- (60 s with the default 30 s lease). A worker of an older version records none: two minutes, as before.
ALTER TABLE workers ADD COLUMN lease_seconds double precision CHECK (lease_seconds > 0);

CREATE FUNCTION worker_alive(heartbeat_at timestamptz, lease_seconds double precision) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT heartbeat_at > now() - make_interval(secs => least(2 * coalesce(lease_seconds, 60), 86400))
$$;
REVOKE ALL ON FUNCTION worker_alive(timestamptz, double precision) FROM PUBLIC;  -- workers' (and owners') only

CREATE OR REPLACE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker serves queue ' || e.queue
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                               AND worker_alive(w.heartbeat_at, w.lease_seconds))
            THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
            ELSE 'no live worker runs application version ' || e.app_version
       END AS reason
FROM workflow_executions e
WHERE e.status = 'enqueued'
  AND NOT EXISTS (SELECT 1 FROM workers w
                  WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                    AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version)
                    AND worker_alive(w.heartbeat_at, w.lease_seconds));
