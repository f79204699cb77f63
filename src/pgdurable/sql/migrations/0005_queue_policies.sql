-- pgdurable schema, version 5: queue policies enforced in SQL (global and per-key concurrency, rate
-- limits), deduplication keys.

-- A queue's policy. A queue without a row (or with every limit NULL) has none: its claims take the
-- plain path, which never looks at this table.
CREATE TABLE queues (
    name                text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    -- At most this many executions of the queue run at once, across all workers.
    concurrency         integer     CHECK (concurrency > 0),
    -- At most this many run at once in any one worker process (the worker enforces it).
    worker_concurrency  integer     CHECK (worker_concurrency > 0),
    -- At most rate_limit starts per rate_period_seconds (a sliding window), across all workers.
    rate_limit          integer     CHECK (rate_limit > 0),
    rate_period_seconds double precision CHECK (rate_period_seconds > 0),
    -- At most this many running executions per concurrency_key (fairness between tenants).
    key_concurrency     integer     CHECK (key_concurrency > 0),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_seconds IS NULL))
);

-- Semaphores without a global lock: a queue with a concurrency limit N has N 'run' slots and a rate
-- limit R has R 'rate' slots. A claim takes free slots with SKIP LOCKED, so concurrent claimers take
-- different slots instead of queueing on one row. A run slot is free when its holder no longer runs
-- that attempt (finished, waiting, swept or re-claimed elsewhere): nothing has to release it. A rate
-- slot is free once its last use is a full period old.
CREATE TABLE queue_slots (
    queue          text        NOT NULL REFERENCES queues (name) ON DELETE CASCADE,
    kind           text        NOT NULL CHECK (kind IN ('run', 'rate')),
    slot           integer     NOT NULL,
    holder_id      text,
    holder_attempt integer,
    used_at        timestamptz,
    PRIMARY KEY (queue, kind, slot)
);

ALTER TABLE workflow_executions
    -- Executions sharing a key are limited together by the queue's key_concurrency.
    ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 200),
    -- While an execution with this key is unfinished in the queue, another with the same key is not
    -- enqueued (the enqueue returns the existing one, or is refused).
    ADD COLUMN dedup_key       text CHECK (length(dedup_key) BETWEEN 1 AND 200);

CREATE UNIQUE INDEX workflow_executions_dedup_idx
    ON workflow_executions (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('enqueued', 'waiting', 'running');

CREATE INDEX workflow_executions_key_running_idx
    ON workflow_executions (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'running';

-- Create, change or remove (all limits NULL) a queue's policy, keeping its slots in step.
CREATE FUNCTION set_queue_policy(queue_name text, concurrency integer, worker_concurrency integer,
                                 rate_limit integer, rate_period_seconds double precision,
                                 key_concurrency integer) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO queues AS q (name, concurrency, worker_concurrency, rate_limit, rate_period_seconds,
                             key_concurrency)
    VALUES (queue_name, concurrency, worker_concurrency, rate_limit, rate_period_seconds, key_concurrency)
    ON CONFLICT (name) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency,
        rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        key_concurrency = EXCLUDED.key_concurrency, updated_at = now();
    DELETE FROM queue_slots s
    WHERE s.queue = queue_name
      AND ((s.kind = 'run' AND s.slot > coalesce(set_queue_policy.concurrency, 0))
        OR (s.kind = 'rate' AND s.slot > coalesce(set_queue_policy.rate_limit, 0)));
    INSERT INTO queue_slots (queue, kind, slot)
    SELECT queue_name, 'run', i FROM generate_series(1, coalesce(set_queue_policy.concurrency, 0)) AS i
    UNION ALL
    SELECT queue_name, 'rate', i FROM generate_series(1, coalesce(set_queue_policy.rate_limit, 0)) AS i
    ON CONFLICT DO NOTHING;
    IF concurrency IS NULL AND worker_concurrency IS NULL AND rate_limit IS NULL AND key_concurrency IS NULL THEN
        DELETE FROM queues WHERE name = queue_name;
    END IF;
END;
$$;

-- The claim of a queue with a policy: like the plain claim (see queries/executions.sql, "claim"), but
-- takes at most as many executions as it got free run slots and rate slots, and skips executions whose
-- concurrency key is at its limit. Returns the same columns as the plain claim.
CREATE FUNCTION claim_with_policy(queue_name text, names text[], owner text, lease double precision,
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
              AND (s.used_at IS NULL OR s.used_at <= now() - make_interval(secs => policy.rate_period_seconds))
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
                                       now() + make_interval(secs => e.timeout_seconds))
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

-- Enqueue from any language, now with a time budget, deduplication and concurrency keys; a delayed start
-- waits in 'waiting' (out of the claim index) until a timer enqueues it. With a dedup_key that an
-- unfinished execution of the queue already has, returns that execution's id instead of a new one.
DROP FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer);

CREATE FUNCTION enqueue_workflow(
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
    IF start_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_workflow: give start_at or delay, not both' USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT timeout_seconds > 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: timeout_seconds must be positive' USING ERRCODE = '22023';
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

REVOKE ALL ON FUNCTION enqueue_workflow(text, jsonb, text, text, integer, timestamptz, interval, integer,
                                        double precision, text, text),
                       set_queue_policy(text, integer, integer, integer, double precision, integer),
                       claim_with_policy(text, text[], text, double precision, integer, text)
    FROM PUBLIC;

CREATE OR REPLACE FUNCTION grant_application_role(role_name name) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    schema_name text := current_schema();
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.enqueue_workflow(text, jsonb, text, text, integer, '
                   'timestamptz, interval, integer, double precision, text, text), %I.workflow_status(text), '
                   '%I.cancel_workflow(text), %I.send_message(text, jsonb, text, text), '
                   '%I.workflow_event(text, text) TO %I',
                   schema_name, schema_name, schema_name, schema_name, schema_name, role_name);
END;
$$;
