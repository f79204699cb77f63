-- pgdurable schema, version 8: hardening. Runs with search_path set to "<schema>, pg_temp", like every
-- migration; SET search_path FROM CURRENT pins that into the functions below.
--
-- 1. Time limits. Older versions accepted a timeout_seconds of NaN, Infinity or 1e300 and start times of
--    +-infinity or the year 20000. Such a row broke the claim of its whole queue ("interval out of range")
--    and every read path that loads timestamps. Bad rows are repaired first (unfinished ones fail with a
--    clear error), then CHECK constraints make them impossible, and enqueue_workflow refuses them.
-- 2. Grants survive upgrades: the roles given grant_application_role / grant_worker_role are recorded in
--    granted_roles, and the migration runner re-applies their grants after every migration (so a
--    function that a later migration drops and recreates, or a new table, is granted again). Roles
--    granted before this version are found from the privileges they hold.
-- 3. The worker role may read schema_migrations but no longer write it.
-- 4. Trigger functions run with a pinned search_path, whoever fires them.
-- 5. Execution ids beginning with "sched:" are reserved for schedule ticks.
--
-- Rule for later migrations: a migration that adds a table, sequence or function needs to do nothing for
-- existing roles (the runner calls reapply_role_grants() after it). One that adds a function for the
-- application role adds it to apply_application_grants. Every new function, trigger functions included,
-- gets SET search_path FROM CURRENT and, unless everybody may call it, REVOKE ALL ... FROM PUBLIC.

-- == 1. Time limits ==================================================================================
-- The limits: a timeout of at most 10 years (315,360,000 s); stored times a client can load (the years
-- 1 to 9999, with a day of margin for time zones). enqueue_workflow is stricter about start times
-- (within 10 years of now).

-- No writer may add a bad row between the repair and the constraints (which take these locks anyway): lock
-- both tables first, in the order the policy claim takes them.
LOCK TABLE queues, workflow_executions IN ACCESS EXCLUSIVE MODE;

-- Repair: unfinished executions with a value outside the limits fail with an error that names it; finished
-- ones just lose the value (NULL). NaN compares greater than every number, so "NOT (x <= limit)" catches it.
WITH bad AS (
    SELECT e.id,
           NOT (e.timeout_seconds > 0 AND e.timeout_seconds <= 315360000) AS bad_timeout,
           NOT (e.available_at BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') AS bad_available,
           NOT (e.deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') AS bad_deadline
    FROM workflow_executions e
    WHERE NOT (e.timeout_seconds > 0 AND e.timeout_seconds <= 315360000)
       OR NOT (e.available_at BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00')
       OR NOT (e.deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00')
    FOR UPDATE
)
UPDATE workflow_executions e
SET timeout_seconds = CASE WHEN bad.bad_timeout THEN NULL ELSE e.timeout_seconds END,
    available_at = CASE WHEN bad.bad_available THEN NULL ELSE e.available_at END,
    deadline = CASE WHEN bad.bad_deadline THEN NULL ELSE e.deadline END,
    status = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN 'failed' ELSE e.status END,
    owner_id = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN NULL ELSE e.owner_id END,
    lease_expires = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN NULL ELSE e.lease_expires END,
    wait_reason = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN NULL ELSE e.wait_reason END,
    completed_at = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN now() ELSE e.completed_at END,
    error = CASE WHEN e.status IN ('enqueued', 'waiting', 'running') THEN jsonb_build_object(
                'type', 'pgdurable.InvalidParameters',
                'message', 'refused by the upgrade to schema version 8: ' || concat_ws('; ',
                    CASE WHEN bad.bad_timeout THEN format(
                        'timeout_seconds %s is not a finite number of seconds > 0 and <= 315360000 (10 years)',
                        e.timeout_seconds) END,
                    CASE WHEN bad.bad_available THEN format(
                        'start time %s is not a finite time between the years 1 and 9999', e.available_at) END,
                    CASE WHEN bad.bad_deadline THEN format(
                        'deadline %s is not a finite time between the years 1 and 9999', e.deadline) END))
            ELSE e.error END,
    updated_at = now()
FROM bad
WHERE e.id = bad.id;

ALTER TABLE workflow_executions
    DROP CONSTRAINT workflow_executions_timeout_seconds_check,
    ADD CONSTRAINT workflow_executions_timeout_seconds_range
        CHECK (timeout_seconds > 0 AND timeout_seconds <= 315360000),
    ADD CONSTRAINT workflow_executions_available_at_range
        CHECK (available_at BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'),
    ADD CONSTRAINT workflow_executions_deadline_range
        CHECK (deadline BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00');

-- A queue's rate period is a time too (the policy claim adds it to now()).
UPDATE queues SET rate_period_seconds = 315360000, updated_at = now()
WHERE NOT (rate_period_seconds <= 315360000);

ALTER TABLE queues
    DROP CONSTRAINT queues_rate_period_seconds_check,
    ADD CONSTRAINT queues_rate_period_seconds_range
        CHECK (rate_period_seconds > 0 AND rate_period_seconds <= 315360000);

-- Same signature as version 5 (CREATE OR REPLACE keeps its grants). New: the time limits, and ids that
-- begin with "sched:" are refused (schedule ticks use them; a caller that took a tick's id first would
-- suppress that tick).
CREATE OR REPLACE FUNCTION enqueue_workflow(
    workflow_name   text,
    input           jsonb       DEFAULT '{}',
    queue           text        DEFAULT 'default',
    workflow_id     text        DEFAULT NULL,
    priority        integer     DEFAULT 0,
    start_at        timestamptz DEFAULT NULL,
    delay           interval    DEFAULT NULL,
    max_recoveries  integer     DEFAULT 5,
    timeout_seconds double precision DEFAULT NULL,
    dedup_key       text        DEFAULT NULL,
    concurrency_key text        DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    new_id text := coalesce(workflow_id, gen_random_uuid()::text);
    owner_name text;
    duplicate_id text;
    starts timestamptz;
    ten_years constant interval := make_interval(secs => 315360000);
BEGIN
    IF workflow_name IS NULL OR length(workflow_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_name must be 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF input IS NULL OR jsonb_typeof(input) <> 'object' THEN
        RAISE EXCEPTION 'enqueue_workflow: input must be a JSON object of arguments by name, not %',
                        coalesce(jsonb_typeof(input), 'NULL')
            USING ERRCODE = '22023', HINT = 'for example: ''{"order_id": 42}''::jsonb';
    END IF;
    IF octet_length(input::text) > 8388608 THEN
        RAISE EXCEPTION 'enqueue_workflow: input is % bytes of JSON; the limit is 8 MiB', octet_length(input::text)
            USING ERRCODE = '54000', HINT = 'store large payloads in a table and pass their key';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'enqueue_workflow: queue % is not a valid queue name', quote_nullable(queue)
            USING ERRCODE = '22023', HINT = '1 to 100 letters, digits, or _ . : -';
    END IF;
    IF length(new_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF starts_with(new_id, 'sched:') THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_id % begins with "sched:", which is reserved for schedule ticks',
                        quote_literal(new_id)
            USING ERRCODE = '22023';
    END IF;
    IF start_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_workflow: give start_at or delay, not both' USING ERRCODE = '22023';
    END IF;
    IF start_at IS NOT NULL AND NOT (start_at BETWEEN now() - ten_years AND now() + ten_years) THEN
        RAISE EXCEPTION 'enqueue_workflow: start_at % is not a finite time within 10 years of now', start_at
            USING ERRCODE = '22023';
    END IF;
    IF delay IS NOT NULL AND NOT (delay BETWEEN interval '0' AND ten_years) THEN
        RAISE EXCEPTION 'enqueue_workflow: delay % must be >= 0 and <= 10 years (315360000 seconds)', delay
            USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT (timeout_seconds > 0 AND timeout_seconds <= 315360000) THEN
        RAISE EXCEPTION 'enqueue_workflow: timeout_seconds % must be a finite number of seconds, > 0 and <= '
                        '315360000 (10 years)', timeout_seconds
            USING ERRCODE = '22023';
    END IF;
    IF length(dedup_key) NOT BETWEEN 1 AND 200 OR length(concurrency_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue_workflow: dedup_key and concurrency_key must be 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;

    starts := coalesce(start_at, now() + coalesce(delay, interval '0'));
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at,
                                          status, wait_reason, timeout_seconds, dedup_key, concurrency_key)
    VALUES (new_id, workflow_name, queue, priority, input, max_recoveries, starts,
            CASE WHEN starts > now() THEN 'waiting' ELSE 'enqueued' END,
            CASE WHEN starts > now() THEN 'delay' END, timeout_seconds, dedup_key, concurrency_key)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT e.name INTO owner_name FROM workflow_executions e WHERE e.id = new_id;
        IF owner_name IS NULL AND dedup_key IS NOT NULL THEN
            SELECT e.id INTO duplicate_id FROM workflow_executions e
            WHERE e.queue = queue AND e.dedup_key = dedup_key AND e.status IN ('enqueued', 'waiting', 'running');
            IF duplicate_id IS NOT NULL THEN
                RETURN duplicate_id;
            END IF;
        END IF;
        IF owner_name IS DISTINCT FROM workflow_name THEN
            RAISE EXCEPTION 'enqueue_workflow: workflow id % already belongs to workflow %', new_id, owner_name
                USING ERRCODE = '23505';
        END IF;
    END IF;
    RETURN new_id;
END;
$$;

-- The policy claim, as in version 5, except that no row can make it raise: the timeout and the rate
-- period are clamped to 10 years (the constraints above already hold them there; this is belt and braces,
-- because one bad row here would stop its whole queue).
CREATE OR REPLACE FUNCTION claim_with_policy(queue_name text, names text[], owner text, lease double precision,
                                             max_claims integer, version text)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    policy queues%ROWTYPE;
    run_slots integer[];
    rate_slots integer[];
    wanted integer := max_claims;
    chosen text[] := '{}';
    chosen_keys text[] := '{}';
    candidate record;
    running_for_key integer;
    scanned integer := 0;
BEGIN
    SELECT * INTO policy FROM queues q WHERE q.name = queue_name;
    IF policy.concurrency IS NOT NULL THEN
        SELECT array_agg(s.slot) INTO run_slots FROM (
            SELECT s.slot FROM queue_slots s
            LEFT JOIN workflow_executions e ON e.id = s.holder_id
            WHERE s.queue = queue_name AND s.kind = 'run'
              AND (s.holder_id IS NULL OR e.id IS NULL OR e.status <> 'running' OR e.attempt <> s.holder_attempt)
            ORDER BY s.slot
            LIMIT wanted
            FOR UPDATE OF s SKIP LOCKED) s;
        wanted := least(wanted, coalesce(cardinality(run_slots), 0));
    END IF;
    IF policy.rate_limit IS NOT NULL AND wanted > 0 THEN
        SELECT array_agg(s.slot) INTO rate_slots FROM (
            SELECT s.slot FROM queue_slots s
            WHERE s.queue = queue_name AND s.kind = 'rate'
              AND (s.used_at IS NULL
                   OR s.used_at <= now() - make_interval(secs => least(policy.rate_period_seconds, 315360000)))
            ORDER BY s.slot
            LIMIT wanted
            FOR UPDATE OF s SKIP LOCKED) s;
        wanted := least(wanted, coalesce(cardinality(rate_slots), 0));
    END IF;
    IF wanted <= 0 THEN
        RETURN;
    END IF;

    -- Walk the queue in claim order. Keyed executions are taken only while their key has room: the
    -- key's advisory lock (held to the end of this transaction) makes concurrent claimers of one key take
    -- turns, and the count below runs after it is held, so it sees every claim of the key committed
    -- before. The walk is bounded, so one busy key at the head of a long queue cannot make claims slow.
    FOR candidate IN
        SELECT e.id, e.concurrency_key FROM workflow_executions e
        WHERE e.status = 'enqueued' AND e.queue = queue_name AND e.name = ANY (names)
          AND e.available_at <= now() AND (e.app_version IS NULL OR e.app_version = version)
        ORDER BY e.priority, e.seq
        FOR UPDATE SKIP LOCKED
    LOOP
        scanned := scanned + 1;
        EXIT WHEN scanned > 1000;
        IF candidate.concurrency_key IS NOT NULL AND policy.key_concurrency IS NOT NULL THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended(queue_name || ':' || candidate.concurrency_key, 7231));
            SELECT count(*) INTO running_for_key FROM workflow_executions e
            WHERE e.queue = queue_name AND e.concurrency_key = candidate.concurrency_key AND e.status = 'running';
            running_for_key := running_for_key
                + (SELECT count(*) FROM unnest(chosen_keys) k WHERE k = candidate.concurrency_key);
            CONTINUE WHEN running_for_key >= policy.key_concurrency;
            chosen_keys := chosen_keys || candidate.concurrency_key;
        END IF;
        chosen := chosen || candidate.id;
        EXIT WHEN cardinality(chosen) >= wanted;
    END LOOP;

    RETURN QUERY
    WITH claimed AS (
        UPDATE workflow_executions e
        SET status = 'running',
            owner_id = owner,
            lease_expires = now() + make_interval(secs => lease),
            attempt = e.attempt + 1,
            -- The moment of the claim itself (not the transaction's start, before the slots and key
            -- locks were taken), so that limits can be checked against these timestamps.
            started_at = coalesce(e.started_at, clock_timestamp()),
            updated_at = now(),
            app_version = version,
            deadline = CASE WHEN e.timeout_seconds IS NOT NULL AND (e.deadline IS NULL OR e.started_at IS NULL)
                            THEN least(coalesce(e.deadline, 'infinity'),
                                       now() + make_interval(secs => least(e.timeout_seconds, 315360000)))
                            ELSE e.deadline END
        WHERE e.id = ANY (chosen)
        RETURNING e.id, e.name, e.attempt, e.input, e.forked_from, e.seq, e.priority
    ), numbered AS (
        SELECT c.*, row_number() OVER (ORDER BY c.priority, c.seq) AS n FROM claimed c
    ), held AS (
        UPDATE queue_slots s
        SET holder_id = numbered.id, holder_attempt = numbered.attempt
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'run' AND s.slot = run_slots[numbered.n]
    ), used AS (
        -- The slot's use is stamped after the claim's own started_at (both clock times), and a slot is
        -- reused only a full period after it by the transaction start of a later claim: any two starts
        -- through one slot are at least a period apart.
        UPDATE queue_slots s
        SET used_at = clock_timestamp()
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'rate' AND s.slot = rate_slots[numbered.n]
    )
    SELECT numbered.id, numbered.name, numbered.attempt, numbered.input, now(),
           numbered.attempt > 1 OR numbered.forked_from IS NOT NULL
    FROM numbered;
END;
$$;

-- == 4. Trigger functions resolve names in this schema, whatever the search_path of the session that
-- fires them (a schema of the caller's could otherwise shadow workflow_executions, or pg_notify when the
-- caller puts pg_catalog after it).
ALTER FUNCTION notify_execution_change() SET search_path FROM CURRENT;
ALTER FUNCTION notify_enqueued() SET search_path FROM CURRENT;
ALTER FUNCTION notify_event() SET search_path FROM CURRENT;
ALTER FUNCTION notify_schedule_change() SET search_path FROM CURRENT;

-- == 2, 3. Roles =====================================================================================

-- The roles given a grant function, and which one (a role may be both). By OID, so a renamed role stays
-- known; a dropped one is forgotten at the next re-application. Forget a role that should keep no grants
-- by deleting its row (and revoking what it holds).
CREATE TABLE granted_roles (
    role_oid   oid         NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('application', 'worker')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role_oid, kind)
);

-- The application role's privileges: the schema, and the five functions of the SQL API. Nothing else
-- (no table).
CREATE FUNCTION apply_application_grants(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.enqueue_workflow(text, jsonb, text, text, integer, '
                   'timestamptz, interval, integer, double precision, text, text), %1$I.workflow_status(text), '
                   '%1$I.cancel_workflow(text), %1$I.send_message(text, jsonb, text, text), '
                   '%1$I.workflow_event(text, text) TO %2$I', schema_name, role_name);
END;
$$;

-- The worker role's privileges: it runs arbitrary workflow code and writes every execution, so it is
-- trusted with the engine's tables and functions; but it only reads the migration history, and neither
-- reads nor writes the grant records nor calls the grant functions.
CREATE FUNCTION apply_worker_grants(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO %I',
                   schema_name, role_name);
    EXECUTE format('REVOKE ALL ON TABLE %1$I.schema_migrations, %1$I.granted_roles FROM %2$I',
                   schema_name, role_name);
    EXECUTE format('GRANT SELECT ON TABLE %I.schema_migrations TO %I', schema_name, role_name);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %1$I.grant_application_role(name), %1$I.grant_worker_role(name), '
                   '%1$I.apply_application_grants(name), %1$I.apply_worker_grants(name), '
                   '%1$I.reapply_role_grants() FROM %2$I', schema_name, role_name);
END;
$$;

-- Grant again, to every recorded role that still exists, what its kind needs now. The migration runner
-- calls this after applying migrations.
CREATE FUNCTION reapply_role_grants() RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    recorded record;
BEGIN
    DELETE FROM granted_roles g WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.role_oid);
    FOR recorded IN SELECT r.rolname, g.kind FROM granted_roles g JOIN pg_roles r ON r.oid = g.role_oid
                    ORDER BY g.kind, r.rolname LOOP
        IF recorded.kind = 'application' THEN
            PERFORM apply_application_grants(recorded.rolname);
        ELSE
            PERFORM apply_worker_grants(recorded.rolname);
        END IF;
    END LOOP;
END;
$$;

-- Same signatures as before (their REVOKE FROM PUBLIC stays): grant, and remember the role.
CREATE OR REPLACE FUNCTION grant_application_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO granted_roles (role_oid, kind) VALUES (role_name::regrole::oid, 'application')
    ON CONFLICT DO NOTHING;
    PERFORM apply_application_grants(role_name);
END;
$$;

CREATE OR REPLACE FUNCTION grant_worker_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO granted_roles (role_oid, kind) VALUES (role_name::regrole::oid, 'worker')
    ON CONFLICT DO NOTHING;
    PERFORM apply_worker_grants(role_name);
END;
$$;

REVOKE ALL ON FUNCTION apply_application_grants(name), apply_worker_grants(name), reapply_role_grants()
    FROM PUBLIC;

-- Roles granted before this version: a worker role holds UPDATE on the execution table (every version
-- granted it); an application role holds EXECUTE on workflow_status and cancel_workflow (granted since
-- version 2 and never recreated) without being a worker. Only direct grants count, not the owner's.
INSERT INTO granted_roles (role_oid, kind)
SELECT DISTINCT acl.grantee, 'worker'
FROM pg_class c, aclexplode(c.relacl) AS acl
WHERE c.oid = 'workflow_executions'::regclass AND acl.privilege_type = 'UPDATE'
  AND acl.grantee <> 0 AND acl.grantee <> c.relowner
ON CONFLICT DO NOTHING;

INSERT INTO granted_roles (role_oid, kind)
SELECT acl.grantee, 'application'
FROM pg_proc p, aclexplode(p.proacl) AS acl
WHERE p.oid IN ('workflow_status(text)'::regprocedure, 'cancel_workflow(text)'::regprocedure)
  AND acl.privilege_type = 'EXECUTE' AND acl.grantee <> 0 AND acl.grantee <> p.proowner
  AND NOT EXISTS (SELECT 1 FROM granted_roles g WHERE g.role_oid = acl.grantee AND g.kind = 'worker')
GROUP BY acl.grantee
HAVING count(DISTINCT p.oid) = 2
ON CONFLICT DO NOTHING;

SELECT reapply_role_grants();
