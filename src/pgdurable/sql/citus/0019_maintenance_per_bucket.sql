-- The Citus layout, version 19 (recorded in schema_migrations as 10019): the maintenance duties one bucket per
-- statement (docs/scale-out.md, "Maintenance duties").
--
-- In 0018 each duty (the sweep of expired leases, the timer's wake-up of due executions, deadlines, the
-- unrunnable check, retention) was one function looping over every bucket: one statement that took as long as
-- 32 routed statements and more, and that a statement_timeout or a pg_cancel_backend cut off every time, so
-- that no bucket was ever served. Each duty now has a function for one bucket and at most `lim` executions,
-- which the worker calls bucket after bucket (worker/maintenance/buckets.py): a bucket whose statement fails
-- or is cancelled is left for the next pass, and its batch made smaller, while the others are served. The
-- functions of 0018 keep their signatures (the time-skipping test clock and `pgdurable cleanup` call them) and
-- now loop over the per-bucket ones, so that each piece of logic is written once.

-- == The sweep of expired leases ==========================================================================
-- Candidates are locked in one routed statement, then each is updated by its own routed statement with the
-- values computed here: Citus refuses STABLE functions (format, jsonb_build_object) over columns in a
-- distributed UPDATE.
CREATE FUNCTION citus_sweep_bucket(b smallint, lim integer) RETURNS TABLE (id text, status text, recoveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    expired record;
    dead boolean;
    new_status text;
    new_error jsonb;
    new_completed_at timestamptz;
    new_wait_reason text;
    woken text[] := '{}';
    finished text[] := '{}';
    parents text[] := '{}';
BEGIN
    FOR expired IN
        SELECT e.id, e.recoveries, e.max_recoveries, e.owner_id, e.queue, e.parent_id, e.error, e.wait_reason
        FROM workflow_executions e
        WHERE e.bucket = b AND e.status = 'running' AND e.lease_expires < now()
        ORDER BY e.lease_expires
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    LOOP
        dead := expired.recoveries + 1 > expired.max_recoveries;
        -- every value computed here: Citus refuses STABLE functions (jsonb_build_object) in CASE
        IF dead THEN
            new_status := 'failed';
            new_error := jsonb_build_object(
                'type', 'pgdurable.DeadLettered',
                'message', format('the worker running this execution was lost %s times (last owner %s); '
                                  'giving up after max_recoveries=%s',
                                  expired.recoveries + 1, expired.owner_id, expired.max_recoveries));
            new_completed_at := at;
            new_wait_reason := NULL;
        ELSE
            new_status := 'enqueued';
            new_error := expired.error;
            new_completed_at := NULL;
            new_wait_reason := expired.wait_reason;
        END IF;
        UPDATE workflow_executions e
        SET status = new_status, error = new_error, completed_at = new_completed_at,
            wait_reason = new_wait_reason, recoveries = expired.recoveries + 1, owner_id = NULL,
            lease_expires = NULL, updated_at = at
        WHERE e.bucket = b AND e.id = expired.id;
        id := expired.id; status := CASE WHEN dead THEN 'failed' ELSE 'enqueued' END;
        recoveries := expired.recoveries + 1;
        RETURN NEXT;
        IF dead THEN
            finished := finished || expired.id;
            parents := parents || expired.parent_id;
        ELSIF NOT expired.queue = ANY (woken) THEN
            woken := woken || expired.queue;
        END IF;
    END LOOP;
    IF cardinality(woken) > 0 THEN
        PERFORM ring_doorbells(woken);
    END IF;
    PERFORM citus_finished(finished, parents, NULL, at);
END;
$$;

CREATE OR REPLACE FUNCTION citus_sweep_expired() RETURNS TABLE (id text, status text, recoveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            RETURN QUERY SELECT s.id, s.status, s.recoveries FROM citus_sweep_bucket(b, 1000) s;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
END;
$$;

-- == The timer: due executions enqueued ===================================================================
-- One routed statement: the due executions enqueued, and when the bucket's next waiting one is due (after
-- `at`), so that the timer sleeps until the soonest of the buckets it knows; `woken` = `lim` means the bucket
-- may have more due now.
CREATE FUNCTION citus_wake_bucket(b smallint, lim integer)
RETURNS TABLE (woken bigint, next_due timestamptz, now timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    queues text[];
BEGIN
    WITH due AS (
        SELECT e.id FROM workflow_executions e
        WHERE e.bucket = b AND e.status = 'waiting' AND e.available_at <= at
        ORDER BY e.available_at
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    ), enqueued AS (
        UPDATE workflow_executions e
        SET status = 'enqueued', wait_reason = NULL, updated_at = at
        FROM due
        WHERE e.bucket = b AND e.id = due.id AND e.status = 'waiting'
        RETURNING e.queue
    )
    SELECT (SELECT array_agg(q.queue) FROM enqueued q),
           (SELECT min(e.available_at) FROM workflow_executions e
            WHERE e.bucket = b AND e.status = 'waiting' AND e.available_at > at)
    INTO queues, next_due;
    woken := coalesce(cardinality(queues), 0);
    IF woken > 0 THEN
        PERFORM ring_doorbells(ARRAY(SELECT DISTINCT unnest(queues)));
    END IF;
    now := at;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION citus_wake_due() RETURNS TABLE (woken bigint, next_due timestamptz, now timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
    one record;
    n bigint := 0;
    soonest timestamptz;
    at timestamptz := clock_now();
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            SELECT * INTO one FROM citus_wake_bucket(b, 1000);
            n := n + one.woken;
            IF soonest IS NULL OR one.next_due < soonest THEN
                soonest := one.next_due;
            END IF;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    woken := n; next_due := soonest; now := at;
    RETURN NEXT;
END;
$$;

-- == Deadlines ============================================================================================
CREATE FUNCTION citus_expire_bucket(b smallint, lim integer) RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    late record;
    finished text[] := '{}';
    parents text[] := '{}';
    stopped text[] := '{}';
BEGIN
    FOR late IN
        SELECT e.id, e.status, e.parent_id, e.deadline, e.timeout_seconds FROM workflow_executions e
        WHERE e.bucket = b AND e.deadline < at AND e.status IN ('enqueued', 'waiting', 'running')
        ORDER BY e.deadline
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE workflow_executions e
        SET status = 'failed', owner_id = NULL, lease_expires = NULL, wait_reason = NULL,
            completed_at = at, updated_at = at,
            error = jsonb_build_object(
                'type', 'pgdurable.WorkflowTimeout',
                'message', format('deadline %s passed (timeout %s s)', late.deadline, late.timeout_seconds))
        WHERE e.bucket = b AND e.id = late.id;
        id := late.id;
        RETURN NEXT;
        finished := finished || late.id;
        parents := parents || late.parent_id;
        IF late.status = 'running' THEN
            stopped := stopped || late.id;
        END IF;
    END LOOP;
    PERFORM citus_finished(finished, parents, stopped, at);
END;
$$;

CREATE OR REPLACE FUNCTION citus_expire_deadlines() RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            RETURN QUERY SELECT x.id FROM citus_expire_bucket(b, 1000) x;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
END;
$$;

-- == Executions no live worker knows =======================================================================
-- The live workers are read on the coordinator (a plain table) at every call: one bucket is one statement.
CREATE FUNCTION citus_fail_unrunnable_bucket(b smallint, grace double precision, lim integer)
RETURNS TABLE (id text, name text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    cutoff timestamptz := at - make_interval(secs => grace);
    served text[];
    known text[];
    stuck record;
    finished text[] := '{}';
    parents text[] := '{}';
BEGIN
    SELECT coalesce(array_agg(DISTINCT q), '{}') INTO served
    FROM workers w, unnest(w.queues) AS q WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    IF cardinality(served) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(DISTINCT q || E'\n' || n), '{}') INTO known
    FROM workers w, unnest(w.queues) AS q, unnest(w.workflows) AS n
    WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    FOR stuck IN
        SELECT e.id, e.name, e.queue, e.parent_id FROM workflow_executions e
        WHERE e.bucket = b AND e.status = 'enqueued' AND e.available_at < cutoff
          AND e.queue = ANY (served) AND NOT (e.queue || E'\n' || e.name) = ANY (known)
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE workflow_executions e
        SET status = 'failed', completed_at = at, updated_at = at, wait_reason = NULL,
            error = jsonb_build_object(
                'type', 'pgdurable.UnknownWorkflow',
                'message', format('no live worker serving queue %L registers workflow %L', stuck.queue,
                                  stuck.name))
        WHERE e.bucket = b AND e.id = stuck.id;
        id := stuck.id; name := stuck.name;
        RETURN NEXT;
        finished := finished || stuck.id;
        parents := parents || stuck.parent_id;
    END LOOP;
    PERFORM citus_finished(finished, parents, NULL, at);
END;
$$;

CREATE OR REPLACE FUNCTION citus_fail_unrunnable(grace double precision) RETURNS TABLE (id text, name text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            RETURN QUERY SELECT u.id, u.name FROM citus_fail_unrunnable_bucket(b, grace, 1000) u;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
END;
$$;

-- == Retention ============================================================================================
CREATE FUNCTION citus_cleanup_bucket(b smallint, cutoff timestamptz, statuses text[], lim integer)
RETURNS TABLE (executions bigint, steps bigint, messages bigint, events bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    doomed text[];
BEGIN
    executions := 0; steps := 0; messages := 0; events := 0;
    SELECT array_agg(d.id) INTO doomed FROM citus_deletable(b, cutoff, statuses, lim, true) d;
    IF doomed IS NOT NULL THEN
        DELETE FROM operation_outputs o WHERE o.bucket = b AND o.execution_id = ANY (doomed);
        GET DIAGNOSTICS steps = ROW_COUNT;
        DELETE FROM workflow_messages m WHERE m.bucket = b AND m.destination_id = ANY (doomed);
        GET DIAGNOSTICS messages = ROW_COUNT;
        DELETE FROM workflow_events v WHERE v.bucket = b AND v.execution_id = ANY (doomed);
        GET DIAGNOSTICS events = ROW_COUNT;
        DELETE FROM workflow_streams st WHERE st.bucket = b AND st.execution_id = ANY (doomed);
        DELETE FROM workflow_executions e WHERE e.bucket = b AND e.id = ANY (doomed);
        GET DIAGNOSTICS executions = ROW_COUNT;
    END IF;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION citus_cleanup_batch(cutoff timestamptz, statuses text[], lim integer)
RETURNS TABLE (executions bigint, steps bigint, messages bigint, events bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    b smallint;
    one record;
BEGIN
    executions := 0; steps := 0; messages := 0; events := 0;
    FOREACH b IN ARRAY citus_buckets() LOOP
        EXIT WHEN executions >= lim;
        BEGIN
            SELECT * INTO one FROM citus_cleanup_bucket(b, cutoff, statuses, lim - executions::integer);
            executions := executions + one.executions;
            steps := steps + one.steps;
            messages := messages + one.messages;
            events := events + one.events;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION citus_sweep_bucket(smallint, integer), citus_wake_bucket(smallint, integer),
    citus_expire_bucket(smallint, integer), citus_fail_unrunnable_bucket(smallint, double precision, integer),
    citus_cleanup_bucket(smallint, timestamptz, text[], integer)
    FROM PUBLIC;
