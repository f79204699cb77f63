-- pgdurable schema, version 14: deploys strand nothing.
--
-- 1. Adoption. A worker may claim an execution that another application version started once no live
--    worker of that version is left (none heartbeating within the worker's adopt_after_seconds). The plain
--    claim (a named query) does it with one more parameter; the policy claim needs a new signature, so it
--    is claim_with_policy_v2 (claim_with_policy stays for the workers of a rolling deploy that still call
--    it, now v2 in strict mode). Both also return the version the execution had before the claim, so that a
--    worker that parks it can give it back.
-- 2. Parking. An execution whose recorded history the adopting code does not replay (another step at an
--    ordinal, or recorded steps the code never reached) is parked: status 'waiting', wait_reason
--    'parked', available_at NULL (no timer wakes it; out of the claim index), the reason in parked_reason
--    and app_version back to the version that recorded it. Its deadline still applies. A worker of that
--    version re-enqueues it when it starts; migrate_app_version() moves it to another version.
-- 3. workers.adopt_after_seconds: whether a live worker adopts (NULL: strict, per-version), so that
--    unrunnable_executions knows which enqueued executions some live worker will still take.
-- 4. app_versions() and migrate_app_version(old, new): the versions with unfinished work, and the explicit
--    move of one version's unfinished executions to another.

ALTER TABLE workflow_executions ADD COLUMN parked_reason text;

ALTER TABLE workers ADD COLUMN adopt_after_seconds double precision;

-- == 3. What no live worker will run ==
CREATE OR REPLACE VIEW unrunnable_executions AS
SELECT e.id, e.name, e.queue, e.created_at,
       CASE WHEN e.status = 'waiting'
            THEN 'parked: ' || coalesce(e.parked_reason, 'its history does not replay on the code that claimed it')
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND w.heartbeat_at > now() - interval '2 minutes')
            THEN 'no live worker serves queue ' || e.queue
            WHEN NOT EXISTS (SELECT 1 FROM workers w
                             WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                               AND w.heartbeat_at > now() - interval '2 minutes')
            THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
            ELSE 'no live worker runs application version ' || e.app_version || ' or adopts other versions'
       END AS reason
FROM workflow_executions e
WHERE (e.status = 'enqueued'
       AND NOT EXISTS (SELECT 1 FROM workers w
                       WHERE e.queue = ANY (w.queues) AND e.name = ANY (w.workflows)
                         AND (e.app_version IS NULL OR w.app_version IS NOT DISTINCT FROM e.app_version
                              OR w.adopt_after_seconds IS NOT NULL)
                         AND w.heartbeat_at > now() - interval '2 minutes'))
   OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL);

-- == 1. The policy claim, adopting ==
-- As claim_with_policy, plus: adopt_after (seconds, NULL: never) lets it take executions of versions
-- with no live worker, and previous_version says which version each claimed execution had.
CREATE FUNCTION claim_with_policy_v2(queue_name text, names text[], owner text, lease double precision,
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
        FOR UPDATE OF e SKIP LOCKED
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

-- The previous release's policy claim, for its workers during a rolling deploy: claim_with_policy_v2 in
-- strict mode (no adoption), without previous_version. One body for both.
CREATE OR REPLACE FUNCTION claim_with_policy(queue_name text, names text[], owner text, lease double precision,
                                             max_claims integer, version text)
RETURNS TABLE (id text, name text, attempt integer, input jsonb, db_now timestamptz, has_history boolean)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT c.id, c.name, c.attempt, c.input, c.db_now, c.has_history
    FROM claim_with_policy_v2(queue_name, names, owner, lease, max_claims, version, NULL) AS c;
$$;

-- == 4. Versions ==
-- Every application version with unfinished executions or a live worker: its unfinished executions by
-- status (parked ones apart from the other waiting ones) and its live workers.
CREATE FUNCTION app_versions()
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
        WHERE w.app_version IS NOT NULL AND w.heartbeat_at > now() - interval '2 minutes'
        GROUP BY w.app_version
    )
    SELECT coalesce(u.app_version, l.app_version), coalesce(u.enqueued, 0), coalesce(u.waiting, 0),
           coalesce(u.running, 0), coalesce(u.parked, 0), coalesce(l.live_workers, 0)
    FROM unfinished u FULL JOIN live l ON l.app_version = u.app_version
    ORDER BY 1;
$$;

-- Move the unfinished executions of version old_version to new_version (the workers of new_version resume
-- them), re-enqueueing the parked ones. Running ones keep their owner until that attempt ends: they move
-- too, and the next claim is new_version's. With old_version = new_version, only re-enqueue its parked
-- ones (after a fix deployed under the same, pinned, version). Returns how many executions changed.
CREATE FUNCTION migrate_app_version(old_version text, new_version text) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    moved bigint;
BEGIN
    IF old_version IS NULL OR new_version IS NULL OR new_version = '' THEN
        RAISE EXCEPTION 'migrate_app_version: both versions must be given (got % and %)', old_version, new_version
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workflow_executions e
    SET app_version = new_version,
        status = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN 'enqueued' ELSE e.status END,
        available_at = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN now() ELSE e.available_at END,
        parked_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL ELSE e.parked_reason END,
        wait_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL ELSE e.wait_reason END,
        updated_at = now()
    WHERE e.app_version = old_version AND e.status IN ('enqueued', 'waiting', 'running')
      AND (old_version <> new_version OR (e.status = 'waiting' AND e.wait_reason = 'parked'));
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END;
$$;

REVOKE ALL ON FUNCTION claim_with_policy_v2(text, text[], text, double precision, integer, text, double precision),
                       app_versions(), migrate_app_version(text, text)
    FROM PUBLIC;
