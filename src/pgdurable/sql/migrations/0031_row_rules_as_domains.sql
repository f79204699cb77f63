-- pgdurable schema, version 31: the rules of a workflow_executions row as the types of its columns.
--
-- check_execution_row (migrations 25 and 30) ran as PL/pgSQL for every row inserted or updated: the call and
-- its expression, prepared again in each transaction, cost an enqueue about 30 us of the server's time (a
-- tenth of a one-row commit; docs/benchmarks.md, "The row rules as domains"). A rule that reads one column
-- is now a CHECK of a domain, that column's type: PostgreSQL keeps a domain's checks prepared in each session
-- and runs them only on the values a statement writes (a claim checks the status it sets, not the keys it
-- leaves alone). The one rule over several columns (an owner and a lease exactly while running) stays a
-- CHECK of the table, a small expression with no call. (Rules of one column kept as small CHECKs of the
-- table cost as much as the function: PostgreSQL reads every table CHECK back from its stored text for each
-- statement.) A broken rule is reported as before: SQLSTATE 23514, with the same constraint name.
--
-- The table is not rewritten nor its rows checked again: the columns change to domains over their own types
-- before the domains get their checks (a change to a type with checks would rewrite the table), and the
-- checks are added NOT VALID, as is the table's: the rows stored were held to the same rules by the
-- constraint this replaces. (schema.sql declares them the same way, so that both describe one catalog.)
-- PostgreSQL builds the partial indexes over the changed columns again: those of unfinished work are small,
-- the tags index is as large as the tagged history (about a second for the whole migration over a million
-- finished executions, a fifth of them tagged, on the machine of docs/benchmarks.md).
--
-- A schema with the Citus layout keeps its twelve constraints (see the layout's version 25), and its own
-- insert_executions_v2: everything here is for a single-node schema only.
DO $do$
BEGIN
    IF to_regprocedure('citus_buckets()') IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE $ddl$
        CREATE DOMAIN execution_id AS text;
        CREATE DOMAIN execution_queue AS text;
        CREATE DOMAIN execution_status AS text;
        CREATE DOMAIN execution_timeout AS double precision;
        CREATE DOMAIN execution_available_at AS timestamptz;
        CREATE DOMAIN execution_deadline AS timestamptz;
        CREATE DOMAIN execution_debounce_deadline AS timestamptz;
        CREATE DOMAIN execution_concurrency_key AS text;
        CREATE DOMAIN execution_dedup_key AS text;
        CREATE DOMAIN execution_debounce_key AS text;
        CREATE DOMAIN execution_tags AS jsonb
    $ddl$;
    -- A column's type cannot change under a view or a trigger condition that reads it: both are made again
    -- below, as they were.
    EXECUTE $ddl$
        DROP VIEW unrunnable_executions;
        DROP TRIGGER workflow_executions_notify_update ON workflow_executions;
        DROP TRIGGER workflow_executions_notify_touched ON workflow_executions
    $ddl$;
    EXECUTE $ddl$
        ALTER TABLE workflow_executions
            ALTER COLUMN id TYPE execution_id,
            ALTER COLUMN queue TYPE execution_queue,
            ALTER COLUMN status TYPE execution_status,
            ALTER COLUMN timeout_seconds TYPE execution_timeout,
            ALTER COLUMN available_at TYPE execution_available_at,
            ALTER COLUMN deadline TYPE execution_deadline,
            ALTER COLUMN debounce_deadline TYPE execution_debounce_deadline,
            ALTER COLUMN concurrency_key TYPE execution_concurrency_key,
            ALTER COLUMN dedup_key TYPE execution_dedup_key,
            ALTER COLUMN debounce_key TYPE execution_debounce_key,
            ALTER COLUMN tags TYPE execution_tags,
            DROP CONSTRAINT workflow_executions_row_rules,
            ADD CONSTRAINT workflow_executions_check
                CHECK ((status = 'running') = (owner_id IS NOT NULL AND lease_expires IS NOT NULL)) NOT VALID
    $ddl$;
    -- As in a CHECK constraint, a NULL value passes.
    EXECUTE $ddl$
        ALTER DOMAIN execution_id ADD CONSTRAINT workflow_executions_id_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_queue ADD CONSTRAINT workflow_executions_queue_check
            CHECK (VALUE ~ '^[A-Za-z0-9_.:-]{1,100}$') NOT VALID;
        ALTER DOMAIN execution_status ADD CONSTRAINT workflow_executions_status_check
            CHECK (VALUE IN ('enqueued', 'waiting', 'running', 'succeeded', 'failed', 'cancelled')) NOT VALID;
        ALTER DOMAIN execution_timeout ADD CONSTRAINT workflow_executions_timeout_seconds_range
            CHECK (VALUE > 0 AND VALUE <= 315360000) NOT VALID;
        ALTER DOMAIN execution_available_at ADD CONSTRAINT workflow_executions_available_at_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_deadline ADD CONSTRAINT workflow_executions_deadline_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_debounce_deadline ADD CONSTRAINT workflow_executions_debounce_deadline_range
            CHECK (VALUE BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00') NOT VALID;
        ALTER DOMAIN execution_concurrency_key ADD CONSTRAINT workflow_executions_concurrency_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_dedup_key ADD CONSTRAINT workflow_executions_dedup_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_debounce_key ADD CONSTRAINT workflow_executions_debounce_key_check
            CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
        ALTER DOMAIN execution_tags ADD CONSTRAINT workflow_executions_tags_object
            CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID
    $ddl$;
    EXECUTE $ddl$
        DROP FUNCTION check_execution_row(text, text, text, text, timestamptz, double precision, timestamptz,
                                          timestamptz, text, text, text, timestamptz, jsonb)
    $ddl$;
    EXECUTE $ddl$
        CREATE TRIGGER workflow_executions_notify_update
            AFTER UPDATE OF status ON workflow_executions
            FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status <> 'running')
            EXECUTE FUNCTION notify_execution_change();
        CREATE TRIGGER workflow_executions_notify_touched
            AFTER UPDATE OF wakeups ON workflow_executions
            FOR EACH ROW WHEN (OLD.status = 'enqueued' AND NEW.status = 'enqueued')
            EXECUTE FUNCTION notify_execution_change()
    $ddl$;
    EXECUTE $ddl$
        CREATE VIEW unrunnable_executions AS
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
           OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL)
    $ddl$;
    -- The two functions that return id or status through RETURN QUERY, which takes no domain where the
    -- function's result says text: as they were, with those columns cast (e.id::text, e.status::text). Their
    -- bodies are not indented here, so that they read as in schema.sql (tests/test_schema_sql.py compares).
    EXECUTE $ddl$
CREATE OR REPLACE FUNCTION insert_executions_v2(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    created integer;
    debounced integer;
BEGIN
    RETURN QUERY
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, deadline, dedup_key, concurrency_key,
                                          trace_context, parent_id, forked_from, owner_id, lease_expires, attempt,
                                          started_at, app_version, created_at, updated_at, tags)
    SELECT s.id, s.name, coalesce(s.queue, 'default'), coalesce(s.priority, 0), coalesce(s.input, '{}'),
           coalesce(s.max_recoveries, 5), s.available_at,
           CASE WHEN s.owned THEN 'running' WHEN s.delayed THEN 'waiting' ELSE 'enqueued' END,
           CASE WHEN s.delayed THEN 'delay' END,
           s.timeout_seconds,
           CASE WHEN s.owned AND s.timeout_seconds IS NOT NULL
                THEN least(coalesce(s.deadline, 'infinity'),
                           at + make_interval(secs => least(s.timeout_seconds, 315360000)))
                ELSE s.deadline END,
           s.dedup_key, s.concurrency_key, nullif(s.trace_context, 'null'), s.parent_id, s.forked_from,
           s.owner_id,
           CASE WHEN s.owned THEN now() + make_interval(secs => s.lease_seconds) END,
           CASE WHEN s.owned THEN 1 ELSE 0 END,
           CASE WHEN s.owned THEN at END,
           s.app_version, at, at, nullif(nullif(s.tags, 'null'), '{}')
    FROM (
        SELECT p.*, p.owner_id IS NOT NULL AS owned,
               coalesce(p.start_at, at + make_interval(secs => coalesce(p.delay_seconds, 0))) AS available_at,
               p.owner_id IS NULL AND (p.delay_seconds > 0 OR p.start_at > at) AS delayed
        FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows))
                 WITH ORDINALITY AS p
        WHERE p.debounce_key IS NULL
        ORDER BY p.ordinality
    ) AS s
    ON CONFLICT DO NOTHING
    RETURNING e.id::text, e.name, e.status::text, e.attempt, e.input;
    GET DIAGNOSTICS created = ROW_COUNT;
    -- Wake the workers sleeping on these queues (doorbells): most of the time none sleeps (busy workers claim
    -- again on their own), and one cheap look is all this costs.
    IF EXISTS (SELECT FROM worker_doorbells WHERE armed) THEN
        PERFORM ring_doorbells(ARRAY(
            SELECT DISTINCT coalesce(p.queue, 'default')
            FROM jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows) AS p));
    END IF;
    -- A bulk enqueue (no debounce key anywhere) pays one JSON path scan here, not a second parse of its rows.
    IF NOT (rows @? '$[*].debounce_key ? (@ != null)' OR coalesce(common -> 'debounce_key', 'null') <> 'null') THEN
        IF raise_on_conflict AND created < jsonb_array_length(rows) THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
                USING ERRCODE = '23505', DETAIL = 'insert_executions_v2: an id given is taken';
        END IF;
        RETURN;
    END IF;

    -- Debounced: one pending (not yet started) execution per (workflow, key). A later enqueue of the burst
    -- takes its place: its arguments and tags, and a start debounce_seconds from now, but never after the
    -- burst's deadline (its first enqueue plus debounce_max_seconds). A row a worker is claiming at this
    -- moment is waited for; once started it is no longer pending, so this insert starts the next burst.
    RETURN QUERY
    INSERT INTO workflow_executions AS e (id, name, queue, priority, input, max_recoveries, available_at, status,
                                          wait_reason, timeout_seconds, concurrency_key, trace_context,
                                          created_at, updated_at, tags, debounce_key, debounce_deadline)
    SELECT s.id, s.name, coalesce(s.queue, 'default'), coalesce(s.priority, 0), coalesce(s.input, '{}'),
           coalesce(s.max_recoveries, 5), s.available_at,
           CASE WHEN s.available_at > at THEN 'waiting' ELSE 'enqueued' END,
           CASE WHEN s.available_at > at THEN 'delay' END,
           s.timeout_seconds, s.concurrency_key, nullif(s.trace_context, 'null'), at, at,
           nullif(nullif(s.tags, 'null'), '{}'), s.debounce_key, s.debounce_deadline
    FROM (
        SELECT p.*, least(at + make_interval(secs => coalesce(p.debounce_seconds, 0)), d.deadline) AS available_at,
               d.deadline AS debounce_deadline
        FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows))
                 WITH ORDINALITY AS p,
             LATERAL (SELECT at + make_interval(secs => p.debounce_max_seconds) AS deadline) AS d
        WHERE p.debounce_key IS NOT NULL
        ORDER BY p.ordinality
    ) AS s
    ON CONFLICT (name, debounce_key)
        WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status IN ('enqueued', 'waiting')
    DO UPDATE SET
        input = EXCLUDED.input, tags = EXCLUDED.tags, priority = EXCLUDED.priority,
        timeout_seconds = EXCLUDED.timeout_seconds, concurrency_key = EXCLUDED.concurrency_key,
        available_at = least(EXCLUDED.available_at, e.debounce_deadline),
        status = CASE WHEN least(EXCLUDED.available_at, e.debounce_deadline) > at THEN 'waiting' ELSE 'enqueued' END,
        wait_reason = CASE WHEN least(EXCLUDED.available_at, e.debounce_deadline) > at THEN 'delay' END,
        updated_at = at
    RETURNING e.id::text, e.name, e.status::text, e.attempt, e.input;
    GET DIAGNOSTICS debounced = ROW_COUNT;
    IF raise_on_conflict AND created + debounced < jsonb_array_length(rows) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
            USING ERRCODE = '23505', DETAIL = 'insert_executions_v2: an id given is taken';
    END IF;
END;
$$;
    $ddl$;
    EXECUTE $ddl$
CREATE OR REPLACE FUNCTION claim_with_policy_v2(queue_name text, names text[], owner text, lease double precision,
                                     max_claims integer, version text, adopt_after double precision)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean,
               previous_version text)
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
    chosen_versions text[] := '{}';
    chosen_keys text[] := '{}';
    candidate record;
    running_for_key integer;
    scanned integer := 0;
    at timestamptz := clock_now();
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
        -- A slot locked above may have been taken by a claim that committed after this statement's snapshot
        -- and before the lock: FOR UPDATE re-read the slot's new holder but judged it against the execution
        -- row of the old snapshot (the join no longer matched, so it looked free). With the locks held, look
        -- again in a new statement, which sees every claim committed before them.
        SELECT array_agg(s.slot ORDER BY s.slot) INTO run_slots
        FROM queue_slots s
        LEFT JOIN workflow_executions e ON e.id = s.holder_id
        WHERE s.queue = queue_name AND s.kind = 'run' AND s.slot = ANY (run_slots)
          AND (s.holder_id IS NULL OR e.id IS NULL OR e.status <> 'running' OR e.attempt <> s.holder_attempt);
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

    -- Walk the queue in claim order. Keyed executions are taken only while their key has room: the key's
    -- advisory lock (held to the end of this transaction) makes concurrent claimers of one key take turns,
    -- and the count below runs after it is held, so it sees every claim of the key committed before. The
    -- walk is bounded, so one busy key at the head of a long queue cannot make claims slow. Executions of
    -- a version with a live worker are left to it (adoption).
    FOR candidate IN
        SELECT e.id, e.concurrency_key, e.app_version FROM workflow_executions e
        WHERE e.status = 'enqueued' AND e.queue = queue_name AND e.name = ANY (names)
          AND e.available_at <= at
          AND (e.app_version IS NULL OR e.app_version = version
               OR (adopt_after IS NOT NULL
                   AND e.app_version NOT IN (SELECT w.app_version FROM workers w
                                             WHERE w.app_version IS NOT NULL
                                               AND w.heartbeat_at > now() - make_interval(secs => adopt_after))))
        ORDER BY e.priority, e.seq
        FOR NO KEY UPDATE OF e SKIP LOCKED
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
        chosen_versions := chosen_versions || candidate.app_version;
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
            -- locks were taken), so that limits can be checked against these timestamps; on durable time.
            started_at = coalesce(e.started_at, clock_timestamp() + (at - now())),
            updated_at = at,
            app_version = version,
            deadline = CASE WHEN e.timeout_seconds IS NOT NULL AND (e.deadline IS NULL OR e.started_at IS NULL)
                            THEN least(coalesce(e.deadline, 'infinity'),
                                       at + make_interval(secs => least(e.timeout_seconds, 315360000)))
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
        UPDATE queue_slots s
        SET used_at = clock_timestamp()
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'rate' AND s.slot = rate_slots[numbered.n]
    )
    SELECT numbered.id::text, numbered.name, numbered.attempt, numbered.input, at,
           numbered.attempt > 1 OR numbered.forked_from IS NOT NULL,
           chosen_versions[array_position(chosen, numbered.id)]
    FROM numbered;
END;
$$;
    $ddl$;
END;
$do$;
