-- pgdurable schema, version 21: a result wait no longer hides fresh work from the claim.
--
-- A result wait registered its execution reading it FOR SHARE (version 18), and a claim skips rows locked
-- in any mode that conflicts with FOR UPDATE: work awaited the moment it was enqueued (app.enqueue(...)
-- then result()) was passed over by the claim its own NOTIFY caused, and started at the producer's next
-- claim, a millisecond or more later. The registration now locks FOR KEY SHARE (await_execution_v1), which
-- claims taking FOR NO KEY UPDATE do not skip, and a completion's trigger waits for it with FOR UPDATE.

-- The status of an execution about to be waited for, registering an unfinished one as awaited (its
-- completion then notifies); one round trip. A finished one is only read. An unfinished one is locked FOR
-- KEY SHARE, a lock that a claim (FOR NO KEY UPDATE SKIP LOCKED) does not skip and that a completion waits
-- for (its trigger locks the finished row FOR UPDATE before it looks for registrations), then read again in
-- a statement of its own, which sees a completion that committed while the lock waited for it. Either the
-- wait sees the finished status, or the completion sees the registration. (FOR SHARE, used before, ordered
-- them as well, but a claim skipped the row while a waiter held it: work awaited as soon as it was enqueued
-- waited for the producer's next claim.)
CREATE FUNCTION await_execution_v1(awaited_id text)
RETURNS TABLE (status text, output jsonb, error jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    SELECT e.status, e.output, e.error INTO status, output, error FROM workflow_executions e WHERE e.id = awaited_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF status NOT IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM FROM workflow_executions e WHERE e.id = awaited_id FOR KEY SHARE;
        SELECT e.status, e.output, e.error INTO status, output, error
        FROM workflow_executions e WHERE e.id = awaited_id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF status NOT IN ('succeeded', 'failed', 'cancelled') THEN
            INSERT INTO awaited_executions AS a (execution_id) VALUES (awaited_id) ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION await_execution_v1(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION notify_execution_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'enqueued' THEN
        PERFORM ring_doorbells(ARRAY[NEW.queue]);
    ELSIF NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
        -- Only a finished execution someone waits for notifies its waiters (see awaited_executions). A
        -- waiter registering right now holds the row FOR KEY SHARE (await_execution_v1), which this lock
        -- waits for: the DELETE below, a new statement, then sees its registration.
        PERFORM FROM workflow_executions e WHERE e.id = NEW.id FOR UPDATE;
        DELETE FROM awaited_executions a WHERE a.execution_id = NEW.id;
        IF FOUND THEN
            PERFORM pg_notify(notify_channel('done'), NEW.id);
        END IF;
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
    SELECT numbered.id, numbered.name, numbered.attempt, numbered.input, at,
           numbered.attempt > 1 OR numbered.forked_from IS NOT NULL,
           chosen_versions[array_position(chosen, numbered.id)]
    FROM numbered;
END;
$$;
