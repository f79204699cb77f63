-- pgdurable schema, version 12: the time-skipping test clock, and durable time on one clock.
--
-- 1. test_clock: how far durable time runs ahead of now() on a schema whose clock_now() has the setting
--    pgdurable.test_clock = 'on' (pgdurable.testing sets it on its private test schemas only). Production
--    schemas never read the table: clock_now() checks the setting first.
-- 2. Durable time is clock_now() everywhere it was still now(): the policy claim (availability, deadline,
--    started_at, and the time it returns, from which durable sleeps are computed), a waiting parent or
--    receiver made available, a cancellation's completed_at, a message's created_at, a transactional step's
--    completed_at. Leases, heartbeats and rate-limit windows stay on now(). Bodies only: same signatures.
-- 3. clock_now() is PL/pgSQL: planned once per session, where a SQL function's body was planned again by
--    every statement calling it. With the test clock's check it costs a statement less than before.

CREATE TABLE test_clock (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    ahead     interval NOT NULL DEFAULT '0' CHECK (ahead >= interval '0')
);
INSERT INTO test_clock DEFAULT VALUES;

CREATE OR REPLACE FUNCTION clock_now() RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fake text := pg_catalog.current_setting('pgdurable.fake_now', true);
BEGIN
    IF fake <> '' THEN
        RETURN fake::pg_catalog.timestamptz;
    END IF;
    IF pg_catalog.current_setting('pgdurable.test_clock', true) = 'on' THEN
        RETURN pg_catalog.now() + (SELECT c.ahead FROM test_clock c);
    END IF;
    RETURN pg_catalog.now();
END;
$$;

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM pg_notify(notify_channel('work'), NEW.queue);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM pg_notify(notify_channel('done'), NEW.id);
        IF OLD.status = 'running' AND (NEW.status = 'cancelled' OR NEW.error ->> 'type' = 'pgdurable.WorkflowTimeout') THEN
            PERFORM pg_notify(notify_channel('stop'), NEW.id);
        END IF;
        IF NEW.parent_id IS NOT NULL AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled') THEN
            UPDATE workflow_executions p
            SET wakeups = p.wakeups + 1,
                status = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN 'enqueued'
                              ELSE p.status END,
                available_at = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN clock_now()
                                    ELSE p.available_at END
            WHERE p.id = NEW.parent_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION cancel_workflow(workflow_id text) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH RECURSIVE tree AS (
        SELECT e.id FROM workflow_executions e WHERE e.id = workflow_id
        UNION
        SELECT c.id FROM workflow_executions c JOIN tree t ON c.parent_id = t.id
    ), cancelled AS (
        UPDATE workflow_executions e
        SET status = 'cancelled', owner_id = NULL, lease_expires = NULL, wait_reason = NULL,
            completed_at = clock_now(), updated_at = clock_now()
        FROM tree
        WHERE e.id = tree.id AND e.status IN ('enqueued', 'waiting', 'running')
        RETURNING e.id
    )
    SELECT count(*) FILTER (WHERE id = workflow_id) > 0 FROM cancelled;
$$;

CREATE OR REPLACE FUNCTION send_message(destination_id text, message jsonb, topic text DEFAULT '',
                             idempotency_key text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    IF message IS NULL THEN
        RAISE EXCEPTION 'send_message: message must not be NULL (send JSON ''null'' instead)'
            USING ERRCODE = '22023';
    END IF;
    IF topic IS NULL OR length(topic) > 200 THEN
        RAISE EXCEPTION 'send_message: topic must be a string of at most 200 characters' USING ERRCODE = '22023';
    END IF;
    IF octet_length(message::text) > 8388608 THEN
        RAISE EXCEPTION 'send_message: message is % bytes of JSON; the limit is 8 MiB', octet_length(message::text)
            USING ERRCODE = '54000';
    END IF;
    -- Count the wake-up before storing the message (this also locks the destination row): a receiver
    -- that just looked for messages and is about to suspend sees the count change and looks again.
    UPDATE workflow_executions e
    SET wakeups = e.wakeups + 1,
        status = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN 'enqueued'
                      ELSE e.status END,
        available_at = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN clock_now()
                            ELSE e.available_at END
    WHERE e.id = destination_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send_message: no workflow execution has id %', quote_nullable(destination_id)
            USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO workflow_messages (destination_id, topic, message, idempotency_key, created_at)
    VALUES (destination_id, topic, message, idempotency_key, clock_now())
    ON CONFLICT ON CONSTRAINT workflow_messages_idempotency DO NOTHING;
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION checkpoint_step(execution_id text, attempt integer, step_id integer, step_name text,
                                output jsonb, error jsonb, attempts integer, started_at timestamptz)
RETURNS boolean
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH owned AS (
        SELECT e.id FROM workflow_executions e
        WHERE e.id = checkpoint_step.execution_id AND e.attempt = checkpoint_step.attempt
          AND e.status = 'running' AND e.lease_expires > now()
        FOR SHARE
    ), written AS (
        INSERT INTO operation_outputs (execution_id, step_id, step_name, output, error, attempts,
                                       recorded_by_attempt, started_at, completed_at)
        SELECT owned.id, checkpoint_step.step_id, checkpoint_step.step_name, checkpoint_step.output,
               checkpoint_step.error, checkpoint_step.attempts, checkpoint_step.attempt,
               checkpoint_step.started_at, clock_now()
        FROM owned
        ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) > 0 FROM written;
$$;

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
          AND e.available_at <= at AND (e.app_version IS NULL OR e.app_version = version)
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
        -- The slot's use is stamped after the claim's own started_at (both clock times), and a slot is
        -- reused only a full period after it by the transaction start of a later claim: any two starts
        -- through one slot are at least a period apart.
        UPDATE queue_slots s
        SET used_at = clock_timestamp()
        FROM numbered
        WHERE s.queue = queue_name AND s.kind = 'rate' AND s.slot = rate_slots[numbered.n]
    )
    SELECT numbered.id, numbered.name, numbered.attempt, numbered.input, at,
           numbered.attempt > 1 OR numbered.forked_from IS NOT NULL
    FROM numbered;
END;
$$;
