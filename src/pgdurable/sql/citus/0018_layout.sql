-- The distributed layout on Citus (docs/scale-out.md), applied after the single-node migrations up to 0018 on
-- a database with the citus extension (migrations.py; recorded in schema_migrations as 10018). Runs in the
-- migration's transaction, with the schema first on the search_path and Citus's object propagation deferred.
--
-- Everything an execution owns lives in its bucket: a smallint decided by its id alone (bucket_of), the
-- distribution column of workflow_executions, operation_outputs, workflow_messages, workflow_events,
-- workflow_streams and awaited_executions, all co-located. The small tables (queues, slots, workers,
-- doorbells, schedules, the clock, the migration history, bindings, grants) stay on the coordinator.
-- No trigger is left on a distributed table: the engine's own statements, run on the coordinator, send
-- every NOTIFY and wake every parent (the functions below). Functions that touch distributed tables are
-- PL/pgSQL, read durable time once into a variable, and name the bucket in every statement.

-- == Buckets: one smallint per shard ===================================================================
-- Consecutive values do not spread over the shards, so for each shard of a distributed table of
-- citus.shard_count shards we take the smallest smallint Citus places there, and write that list into
-- bucket_of as a constant. Every table distributed later with this shard count has the same hash ranges.
CREATE TABLE citus_bucket_probe (bucket smallint NOT NULL);
SELECT create_distributed_table('citus_bucket_probe', 'bucket', colocate_with => 'none');

DO $do$
DECLARE
    buckets smallint[];
BEGIN
    SELECT array_agg(first_value ORDER BY shard.shardminvalue::bigint) INTO buckets
    FROM (SELECT get_shard_id_for_distribution_column('citus_bucket_probe', v::smallint) AS shardid,
                 min(v)::smallint AS first_value
          FROM generate_series(0, 32767) AS v
          GROUP BY 1) AS found
    JOIN pg_dist_shard shard ON shard.shardid = found.shardid;
    IF cardinality(buckets) <> (SELECT count(*) FROM pg_dist_shard
                                WHERE logicalrelid = 'citus_bucket_probe'::regclass) THEN
        RAISE EXCEPTION 'citus layout: could not find a smallint for every shard';
    END IF;
    -- The bucket of an execution id: the same hash as PostgreSQL's hash partitioning (which upgrades keep).
    EXECUTE format($f$
        CREATE FUNCTION bucket_of(id text) RETURNS smallint
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        SET search_path FROM CURRENT
        AS $b$SELECT (%1$L::smallint[])[(pg_catalog.hashtextextended(id, 0) %% %2$s + %2$s) %% %2$s + 1]$b$
    $f$, buckets, cardinality(buckets));
    -- Every bucket, in shard order (the producer's rotation, the maintenance loops).
    EXECUTE format($f$
        CREATE FUNCTION citus_buckets() RETURNS smallint[]
        LANGUAGE sql IMMUTABLE
        SET search_path FROM CURRENT
        AS $b$SELECT %1$L::smallint[]$b$
    $f$, buckets);
END;
$do$;
DROP TABLE citus_bucket_probe;

-- == The distributed tables ============================================================================
-- Triggers first: Citus refuses to distribute a table that has any.
DROP TRIGGER workflow_executions_notify_update ON workflow_executions;
DROP TRIGGER workflow_executions_notify_touched ON workflow_executions;
DROP TRIGGER workflow_events_notify ON workflow_events;
DROP TRIGGER workflow_streams_notify ON workflow_streams;

-- The bucket is an ordinary column every insert fills (Citus refuses a generated distribution column).
ALTER TABLE workflow_executions ADD COLUMN bucket smallint;
UPDATE workflow_executions SET bucket = bucket_of(id);
ALTER TABLE workflow_executions ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT workflow_executions_bucket CHECK (bucket = bucket_of(id)),
    DROP CONSTRAINT workflow_executions_pkey,
    ADD PRIMARY KEY (bucket, id);
-- Unique per bucket only: the Citus insert path refuses dedup and debounce keys (docs/scale-out.md).
DROP INDEX workflow_executions_dedup_idx;
CREATE UNIQUE INDEX workflow_executions_dedup_idx
    ON workflow_executions (bucket, queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('enqueued', 'waiting', 'running');
DROP INDEX workflow_executions_debounce_idx;
CREATE UNIQUE INDEX workflow_executions_debounce_idx
    ON workflow_executions (bucket, name, debounce_key)
    WHERE debounce_key IS NOT NULL AND started_at IS NULL AND status IN ('enqueued', 'waiting');
SELECT create_distributed_table('workflow_executions', 'bucket', colocate_with => 'none');

ALTER TABLE operation_outputs ADD COLUMN bucket smallint;
UPDATE operation_outputs SET bucket = bucket_of(execution_id);
ALTER TABLE operation_outputs ALTER COLUMN bucket SET NOT NULL,
    DROP CONSTRAINT operation_outputs_pkey,
    ADD CONSTRAINT operation_outputs_pkey PRIMARY KEY (bucket, execution_id, step_id);
SELECT create_distributed_table('operation_outputs', 'bucket', colocate_with => 'workflow_executions');

ALTER TABLE workflow_messages ADD COLUMN bucket smallint;
UPDATE workflow_messages SET bucket = bucket_of(destination_id);
ALTER TABLE workflow_messages ALTER COLUMN bucket SET NOT NULL,
    DROP CONSTRAINT workflow_messages_pkey,
    ADD PRIMARY KEY (bucket, id),
    DROP CONSTRAINT workflow_messages_idempotency,
    ADD CONSTRAINT workflow_messages_idempotency UNIQUE (bucket, destination_id, idempotency_key);
SELECT create_distributed_table('workflow_messages', 'bucket', colocate_with => 'workflow_executions');

ALTER TABLE workflow_events ADD COLUMN bucket smallint;
UPDATE workflow_events SET bucket = bucket_of(execution_id);
ALTER TABLE workflow_events ALTER COLUMN bucket SET NOT NULL,
    DROP CONSTRAINT workflow_events_pkey,
    ADD PRIMARY KEY (bucket, execution_id, key, step_id);
SELECT create_distributed_table('workflow_events', 'bucket', colocate_with => 'workflow_executions');

ALTER TABLE workflow_streams ADD COLUMN bucket smallint;
UPDATE workflow_streams SET bucket = bucket_of(execution_id);
ALTER TABLE workflow_streams ALTER COLUMN bucket SET NOT NULL,
    DROP CONSTRAINT workflow_streams_pkey,
    ADD PRIMARY KEY (bucket, execution_id, key, step_id);
SELECT create_distributed_table('workflow_streams', 'bucket', colocate_with => 'workflow_executions');

ALTER TABLE awaited_executions ADD COLUMN bucket smallint;
UPDATE awaited_executions SET bucket = bucket_of(execution_id);
ALTER TABLE awaited_executions ALTER COLUMN bucket SET NOT NULL,
    DROP CONSTRAINT awaited_executions_pkey,
    ADD PRIMARY KEY (bucket, execution_id);
SELECT create_distributed_table('awaited_executions', 'bucket', colocate_with => 'workflow_executions');

-- Doorbells stay a plain coordinator table: no forced generic plan there (Citus refuses, or worse, them).
ALTER FUNCTION ring_doorbells(text[]) RESET plan_cache_mode;

-- == Wake-ups, sent from the coordinator ===============================================================
-- What the single-node triggers (notify_execution_change, notify_event) do, called by the functions below
-- after their routed statements: a NOTIFY sent by a shard would reach only the sessions of its worker node.

-- Executions that just finished: notify their waiters ("_done": only those registered in
-- awaited_executions), tell the owners of the given running ones to stop ("_stop"), and wake their parents
-- (a parent waiting on its children is enqueued; any parent's wake-up count is bumped).
CREATE FUNCTION citus_finished(ids text[], parents text[], stopped text[], at timestamptz) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    one text;
    woken_queue text;
BEGIN
    FOREACH one IN ARRAY ids LOOP
        DELETE FROM awaited_executions a WHERE a.bucket = bucket_of(one) AND a.execution_id = one;
        IF FOUND THEN
            PERFORM pg_notify(notify_channel('done'), one);
        END IF;
    END LOOP;
    FOREACH one IN ARRAY coalesce(stopped, '{}') LOOP
        PERFORM pg_notify(notify_channel('stop'), one);
    END LOOP;
    FOR one IN SELECT DISTINCT p FROM unnest(parents) AS p WHERE p IS NOT NULL ORDER BY 1 LOOP
        UPDATE workflow_executions p
        SET wakeups = p.wakeups + 1,
            status = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN 'enqueued'
                          ELSE p.status END,
            available_at = CASE WHEN p.status = 'waiting' AND p.wait_reason = 'children' THEN at
                                ELSE p.available_at END
        WHERE p.bucket = bucket_of(one) AND p.id = one
        RETURNING CASE WHEN p.status = 'enqueued' THEN p.queue END INTO woken_queue;
        IF woken_queue IS NOT NULL THEN
            PERFORM ring_doorbells(ARRAY[woken_queue]);
        END IF;
    END LOOP;
END;
$$;

-- == What the first release refuses on Citus ============================================================

-- Raise the one error of everything the distributed layout cannot do yet (docs/scale-out.md, "Open questions").
CREATE FUNCTION citus_refuse(what text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION '% is not supported on a Citus (distributed) schema yet: see "Open questions" in docs/scale-out.md',
                    what
        USING ERRCODE = 'feature_not_supported';
END;
$$;

-- A table binding's trigger on a distributed or reference table would fire on the shards, on the worker
-- nodes, and enqueue from there: bindings are for the coordinator's own tables.
CREATE FUNCTION citus_bindable(target regclass) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_dist_partition p WHERE p.logicalrelid = target) THEN
        PERFORM citus_refuse(format('bind_table on the distributed or reference table %s', target));
    END IF;
    RETURN true;
END;
$$;

-- Policy claims take slots that would have to be checked against executions in every bucket: a queue's
-- worker_concurrency (enforced by each worker) is all a Citus schema accepts for now.
CREATE OR REPLACE FUNCTION set_queue_policy(queue_name text, concurrency integer, worker_concurrency integer,
                                 rate_limit integer, rate_period_seconds double precision,
                                 key_concurrency integer) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL THEN
        PERFORM citus_refuse('a queue policy with concurrency, rate or per-key limits');
    END IF;
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

-- A table binding's trigger (on a coordinator table: see citus_bindable), with the same change again updated in
-- its bucket.
CREATE OR REPLACE FUNCTION table_binding_fire() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    binding constant jsonb := TG_ARGV[0]::jsonb;
    changed jsonb;
    arguments jsonb;
    key_text text;
    change text;
    new_id text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        changed := to_jsonb(OLD);
    ELSE
        changed := to_jsonb(NEW);
    END IF;
    IF jsonb_typeof(binding -> 'columns') = 'array' THEN
        SELECT coalesce(jsonb_object_agg(c.name, changed -> c.name), '{}') INTO arguments
        FROM jsonb_array_elements_text(binding -> 'columns') AS c(name)
        WHERE changed ? c.name;
    ELSE
        arguments := changed;
    END IF;
    IF (binding ->> 'pass_old')::boolean THEN
        arguments := arguments || jsonb_build_object('old', to_jsonb(OLD));
    END IF;
    SELECT jsonb_agg(changed -> k.name ORDER BY k.n)::text INTO key_text
    FROM jsonb_array_elements_text(binding -> 'key') WITH ORDINALITY AS k(name, n);
    change := lower(left(TG_OP, 1)) || ':' || pg_current_xact_id()::text || '.'
              || floor(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint::text;
    new_id := format('bind:%s:%s:%s', binding ->> 'name', key_text, change);
    IF length(new_id) > 200 THEN
        new_id := format('bind:%s:md5=%s:%s', binding ->> 'name', md5(key_text), change);
    END IF;
    -- Only the fields a binding sets, whoever created the trigger and with whatever argument.
    PERFORM FROM insert_executions_v1(
        jsonb_build_array(jsonb_build_object('id', new_id, 'input', arguments)),
        jsonb_build_object('name', binding -> 'common' -> 'name', 'queue', binding -> 'common' -> 'queue',
                           'priority', binding -> 'common' -> 'priority',
                           'max_recoveries', binding -> 'common' -> 'max_recoveries',
                           'timeout_seconds', binding -> 'common' -> 'timeout_seconds'));
    IF NOT FOUND THEN
        -- The same change again: the latest row, and (with pass_old) the row as it was before the change.
        -- (the row as it was read first: Citus refuses jsonb_build_object over a column in an UPDATE)
        IF (binding ->> 'pass_old')::boolean THEN
            SELECT arguments || jsonb_build_object('old', e.input -> 'old') INTO arguments
            FROM workflow_executions e WHERE e.bucket = bucket_of(new_id) AND e.id = new_id;
        END IF;
        UPDATE workflow_executions e
        SET input = arguments, updated_at = now()
        WHERE e.bucket = bucket_of(new_id) AND e.id = new_id AND e.status = 'enqueued' AND e.attempt = 0;
    END IF;
    RETURN NULL;
END;
$$;

-- == Creating executions: the one insert path, routed ===================================================
-- One routed INSERT ... VALUES per execution (an INSERT ... SELECT from JSON is pulled to the coordinator and
-- committed in two phases, even for one row). Every value is computed first, on the coordinator: Citus
-- refuses STABLE functions inside CASE or COALESCE of a distributed statement. Dedup and debounce keys are
-- unique per bucket only, so they are refused (docs/scale-out.md, "Open questions").
CREATE OR REPLACE FUNCTION insert_executions_v2(rows jsonb, common jsonb DEFAULT '{}', raise_on_conflict boolean DEFAULT false)
RETURNS TABLE (id text, name text, status text, attempt integer, input jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    lease_now timestamptz := now();
    s record;
    made record;
    created integer := 0;
    total integer := 0;
    woken text[] := '{}';
BEGIN
    IF rows @? '$[*].debounce_key ? (@ != null)' OR coalesce(common -> 'debounce_key', 'null') <> 'null'
       OR rows @? '$[*].dedup_key ? (@ != null)' OR coalesce(common -> 'dedup_key', 'null') <> 'null' THEN
        PERFORM citus_refuse('an enqueue with a dedup_key or a debounce_key');
    END IF;
    FOR s IN
        SELECT q.*,
               CASE WHEN q.owned THEN 'running' WHEN q.delayed THEN 'waiting' ELSE 'enqueued' END AS new_status,
               CASE WHEN q.delayed THEN 'delay' END AS new_wait_reason,
               CASE WHEN q.owned AND q.timeout_seconds IS NOT NULL
                    THEN least(coalesce(q.deadline, 'infinity'),
                               at + make_interval(secs => least(q.timeout_seconds, 315360000)))
                    ELSE q.deadline END AS new_deadline,
               CASE WHEN q.owned THEN lease_now + make_interval(secs => q.lease_seconds) END AS new_lease,
               CASE WHEN q.owned THEN 1 ELSE 0 END AS new_attempt,
               CASE WHEN q.owned THEN at END AS new_started_at
        FROM (
            SELECT p.*, coalesce(p.queue, 'default') AS queue_name, p.owner_id IS NOT NULL AS owned,
                   coalesce(p.start_at, at + make_interval(secs => coalesce(p.delay_seconds, 0))) AS starts,
                   p.owner_id IS NULL AND (p.delay_seconds > 0 OR p.start_at > at) AS delayed
            FROM ROWS FROM (jsonb_populate_recordset(jsonb_populate_record(NULL::execution_spec_v2, common), rows))
                     WITH ORDINALITY AS p
        ) AS q
        ORDER BY q.ordinality
    LOOP
        total := total + 1;
        INSERT INTO workflow_executions AS e (bucket, id, name, queue, priority, input, max_recoveries, available_at,
                                              status, wait_reason, timeout_seconds, deadline, concurrency_key,
                                              trace_context, parent_id, forked_from, owner_id, lease_expires,
                                              attempt, started_at, app_version, created_at, updated_at, tags)
        VALUES (bucket_of(s.id), s.id, s.name, s.queue_name, coalesce(s.priority, 0), coalesce(s.input, '{}'),
                coalesce(s.max_recoveries, 5), s.starts, s.new_status, s.new_wait_reason, s.timeout_seconds,
                s.new_deadline, s.concurrency_key, nullif(s.trace_context, 'null'), s.parent_id, s.forked_from,
                s.owner_id, s.new_lease, s.new_attempt, s.new_started_at, s.app_version, at, at,
                nullif(nullif(s.tags, 'null'), '{}'))
        ON CONFLICT DO NOTHING
        RETURNING e.id, e.name, e.status, e.attempt, e.input INTO made;
        IF FOUND THEN
            created := created + 1;
            id := made.id; name := made.name; status := made.status; attempt := made.attempt; input := made.input;
            RETURN NEXT;
            IF made.status = 'enqueued' AND NOT s.queue_name = ANY (woken) THEN
                woken := woken || s.queue_name;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(woken) > 0 AND EXISTS (SELECT FROM worker_doorbells WHERE armed) THEN
        PERFORM ring_doorbells(woken);
    END IF;
    IF raise_on_conflict AND created < total THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "workflow_executions_pkey"'
            USING ERRCODE = '23505', DETAIL = 'insert_executions_v2: an id given is taken';
    END IF;
END;
$$;

-- == The SQL API, routed ================================================================================

CREATE OR REPLACE FUNCTION workflow_status(workflow_id text)
RETURNS TABLE (status text, output jsonb, error jsonb, attempt integer, created_at timestamptz,
               completed_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT e.status, e.output, e.error, e.attempt, e.created_at, e.completed_at
    FROM workflow_executions e WHERE e.bucket = bucket_of(workflow_id) AND e.id = workflow_id;
END;
$$;

CREATE OR REPLACE FUNCTION workflow_event(workflow_id text, key text)
RETURNS TABLE (value jsonb, created_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT ev.value, ev.created_at FROM workflow_events ev
    WHERE ev.bucket = bucket_of(workflow_id) AND ev.execution_id = workflow_id AND ev.key = workflow_event.key
    ORDER BY ev.step_id DESC
    LIMIT 1;
END;
$$;

-- The tree, one level of children at a time (Citus refuses a recursive CTE without the distribution column).
-- The children of a level are found by a scan of every shard (parent_id is not the bucket's key).
CREATE OR REPLACE FUNCTION cancel_workflow(workflow_id text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    at timestamptz := clock_now();
    level text[] := ARRAY[workflow_id];
    seen text[] := ARRAY[workflow_id];
    one text;
    was record;
    root_cancelled boolean := false;
    finished text[] := '{}';
    parents text[] := '{}';
    stopped text[] := '{}';
BEGIN
    WHILE cardinality(level) > 0 LOOP
        FOREACH one IN ARRAY level LOOP
            -- the row as it was, locked, then cancelled (the old status decides who is told to stop)
            SELECT e.status, e.parent_id INTO was FROM workflow_executions e
            WHERE e.bucket = bucket_of(one) AND e.id = one AND e.status IN ('enqueued', 'waiting', 'running')
            FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            UPDATE workflow_executions e
            SET status = 'cancelled', owner_id = NULL, lease_expires = NULL, wait_reason = NULL,
                completed_at = at, updated_at = at
            WHERE e.bucket = bucket_of(one) AND e.id = one;
            finished := finished || one;
            parents := parents || was.parent_id;
            IF was.status = 'running' THEN
                stopped := stopped || one;
            END IF;
            IF one = workflow_id THEN
                root_cancelled := true;
            END IF;
        END LOOP;
        SELECT coalesce(array_agg(c.id), '{}') INTO level
        FROM workflow_executions c WHERE c.parent_id = ANY (level) AND NOT c.id = ANY (seen);
        seen := seen || level;
    END LOOP;
    PERFORM citus_finished(finished, parents, stopped, at);
    RETURN root_cancelled;
END;
$$;

CREATE OR REPLACE FUNCTION send_message(destination_id text, message jsonb, topic text DEFAULT '',
                                        idempotency_key text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(destination_id);
    woken record;
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
    -- Count the wake-up before storing the message (this also locks the destination row).
    UPDATE workflow_executions e
    SET wakeups = e.wakeups + 1,
        status = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN 'enqueued'
                      ELSE e.status END,
        available_at = CASE WHEN e.status = 'waiting' AND e.wait_reason = 'recv:' || topic THEN at
                            ELSE e.available_at END
    WHERE e.bucket = b AND e.id = destination_id
    RETURNING e.status, e.queue INTO woken;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send_message: no workflow execution has id %', quote_nullable(destination_id)
            USING ERRCODE = 'P0002';
    END IF;
    -- Woken, or touched while enqueued (a claim may have passed over the locked row): wake the workers.
    IF woken.status = 'enqueued' THEN
        PERFORM ring_doorbells(ARRAY[woken.queue]);
    END IF;
    INSERT INTO workflow_messages (bucket, destination_id, topic, message, idempotency_key, created_at)
    VALUES (b, destination_id, topic, message, idempotency_key, at)
    ON CONFLICT ON CONSTRAINT workflow_messages_idempotency DO NOTHING;
    RETURN FOUND;
END;
$$;

-- Two statements (the fence, then the insert): as one modifying CTE Citus pulls it to the coordinator and
-- commits in two phases.
CREATE OR REPLACE FUNCTION checkpoint_step(execution_id text, attempt integer, step_id integer, step_name text,
                                           output jsonb, error jsonb, attempts integer, started_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(execution_id);
BEGIN
    PERFORM FROM workflow_executions e
    WHERE e.bucket = b AND e.id = execution_id AND e.attempt = attempt
      AND e.status = 'running' AND e.lease_expires > now()
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO operation_outputs (bucket, execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    VALUES (b, execution_id, step_id, step_name, output, error, attempts, attempt, started_at, at)
    ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING;
    RETURN FOUND;
END;
$$;

-- == Claims: one bucket at a time =======================================================================
-- The plain claim (query "claim") of one bucket: the producer rotates over the buckets (worker/producer.py).
-- The versions of live workers are read first, on the coordinator, so the routed statement joins nothing.
CREATE FUNCTION citus_claim(b smallint, queue_name text, names text[], owner text, lease double precision,
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

-- == Group commit: grouped by bucket ======================================================================
-- One block per bucket of the batch: a bucket whose worker node cannot be reached (SQLSTATE class 08) is
-- left out, so its writes are reported not written (their attempts stop and are resumed later, as after a
-- lost lease), and the other buckets' writes commit. A block is a savepoint: what failed in it is undone.

CREATE FUNCTION citus_write_steps(rows jsonb)
RETURNS TABLE (execution_id text, recorded_by_attempt integer, step_id integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    batch record;
    s record;
    written text[];
BEGIN
    FOR batch IN
        SELECT bucket_of(r ->> 0) AS b, jsonb_agg(r ORDER BY r ->> 0, (r ->> 2)::int) AS members
        FROM jsonb_array_elements(rows) AS r GROUP BY 1 ORDER BY 1
    LOOP
        written := '{}';
        BEGIN
            FOR s IN
                SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, (r ->> 2)::int AS step, r ->> 3 AS step_name,
                       (r ->> 4)::int AS tries, (r ->> 5)::timestamptz AS started_at, r -> 6 AS output,
                       nullif(r -> 7, 'null') AS error
                FROM jsonb_array_elements(batch.members) AS r
            LOOP
                -- the fence: held until the batch commits, so a sweep or a claim waits for it
                PERFORM FROM workflow_executions e
                WHERE e.bucket = batch.b AND e.id = s.id AND e.attempt = s.attempt AND e.status = 'running'
                  AND e.lease_expires > now()
                FOR SHARE;
                CONTINUE WHEN NOT FOUND;
                INSERT INTO operation_outputs AS o (bucket, execution_id, step_id, step_name, output, error,
                                                    attempts, recorded_by_attempt, started_at, completed_at)
                VALUES (batch.b, s.id, s.step, s.step_name, CASE WHEN s.error IS NULL THEN s.output END, s.error,
                        s.tries, s.attempt, s.started_at, at)
                ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING;
                IF FOUND THEN
                    written := written || jsonb_build_array(s.id, s.attempt, s.step)::text;
                END IF;
            END LOOP;
        EXCEPTION WHEN connection_exception THEN
            written := '{}';
        END;
        RETURN QUERY SELECT w::jsonb ->> 0, (w::jsonb ->> 1)::int, (w::jsonb ->> 2)::int FROM unnest(written) AS w;
    END LOOP;
END;
$$;

CREATE FUNCTION citus_write_completions(rows jsonb)
RETURNS TABLE (execution_id text, attempt integer, step_id integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    batch record;
    f record;
    parent text;
    finished text[];
    attempts integer[];
    parents text[];
BEGIN
    FOR batch IN
        SELECT bucket_of(r ->> 0) AS b, jsonb_agg(r ORDER BY r ->> 0) AS members
        FROM jsonb_array_elements(rows) AS r GROUP BY 1 ORDER BY 1
    LOOP
        finished := '{}'; attempts := '{}'; parents := '{}';
        BEGIN
            FOR f IN
                SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, r ->> 2 AS status, r -> 3 AS output,
                       nullif(r -> 4, 'null') AS error
                FROM jsonb_array_elements(batch.members) AS r
            LOOP
                UPDATE workflow_executions e
                SET status = f.status, output = CASE WHEN f.error IS NULL THEN f.output END, error = f.error,
                    owner_id = NULL, lease_expires = NULL, completed_at = at, updated_at = at, wait_reason = NULL
                WHERE e.bucket = batch.b AND e.id = f.id AND e.attempt = f.attempt AND e.status = 'running'
                  AND e.lease_expires > now()
                RETURNING e.parent_id INTO parent;
                IF FOUND THEN
                    finished := finished || f.id;
                    attempts := attempts || f.attempt;
                    parents := parents || parent;
                END IF;
            END LOOP;
            -- in the same block: a completion whose waiters or parent cannot be told is not written either
            PERFORM citus_finished(finished, parents, NULL, at);
        EXCEPTION WHEN connection_exception THEN
            finished := '{}';
        END;
        RETURN QUERY SELECT d.id, d.attempt, NULL::integer FROM unnest(finished, attempts) AS d (id, attempt)
                     WHERE cardinality(finished) > 0;
    END LOOP;
END;
$$;

-- Heartbeats and releases: one routed statement per bucket of the worker's executions (a bucket that cannot
-- be reached is left out: its executions are not renewed, or not released).
CREATE FUNCTION citus_heartbeat(owner text, lease double precision, ids text[])
RETURNS TABLE (id text, attempt integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
    lease_until timestamptz := now() + make_interval(secs => lease);
BEGIN
    FOR b IN SELECT DISTINCT bucket_of(i) FROM unnest(ids) AS i ORDER BY 1 LOOP
        BEGIN
            RETURN QUERY
            UPDATE workflow_executions e SET lease_expires = lease_until
            WHERE e.bucket = b AND e.owner_id = owner AND e.status = 'running' AND e.id = ANY (ids)
            RETURNING e.id, e.attempt;
        EXCEPTION WHEN connection_exception THEN
            NULL;
        END;
    END LOOP;
END;
$$;

CREATE FUNCTION citus_release(owner text, ids text[])
RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    b smallint;
    released record;
    woken text[] := '{}';
BEGIN
    FOR b IN SELECT DISTINCT bucket_of(i) FROM unnest(ids) AS i ORDER BY 1 LOOP
        BEGIN
            FOR released IN
                UPDATE workflow_executions e
                SET status = 'enqueued', owner_id = NULL, lease_expires = NULL, updated_at = at
                WHERE e.bucket = b AND e.owner_id = owner AND e.status = 'running' AND e.id = ANY (ids)
                RETURNING e.id, e.queue
            LOOP
                id := released.id;
                RETURN NEXT;
                woken := woken || released.queue;
            END LOOP;
        EXCEPTION WHEN connection_exception THEN
            NULL;
        END;
    END LOOP;
    IF cardinality(woken) > 0 THEN
        PERFORM ring_doorbells(ARRAY(SELECT DISTINCT unnest(woken)));
    END IF;
END;
$$;

CREATE FUNCTION citus_load_steps(ids text[])
RETURNS TABLE (execution_id text, step_id integer, step_name text, output jsonb, error jsonb)
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
BEGIN
    FOR b IN SELECT DISTINCT bucket_of(i) FROM unnest(ids) AS i ORDER BY 1 LOOP
        RETURN QUERY
        SELECT o.execution_id, o.step_id, o.step_name, o.output, o.error FROM operation_outputs o
        WHERE o.bucket = b AND o.execution_id = ANY (ids)
        ORDER BY o.execution_id, o.step_id;
    END LOOP;
END;
$$;

-- == Maintenance: a loop over the buckets ===============================================================
-- Each bucket in a block of its own: a bucket whose worker node cannot be reached (SQLSTATE class 08) is
-- skipped, and the duty goes on with the others.

-- Candidates are locked in one routed statement per bucket, then each is updated by its own routed statement
-- with the values computed here: Citus refuses STABLE functions (format, jsonb_build_object) over columns in
-- a distributed UPDATE.
CREATE FUNCTION citus_sweep_expired() RETURNS TABLE (id text, status text, recoveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    b smallint;
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
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            FOR expired IN
                SELECT e.id, e.recoveries, e.max_recoveries, e.owner_id, e.queue, e.parent_id, e.error, e.wait_reason
                FROM workflow_executions e
                WHERE e.bucket = b AND e.status = 'running' AND e.lease_expires < now()
                ORDER BY e.lease_expires
                LIMIT 1000
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
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    IF cardinality(woken) > 0 THEN
        PERFORM ring_doorbells(woken);
    END IF;
    PERFORM citus_finished(finished, parents, NULL, at);
END;
$$;

CREATE FUNCTION citus_wake_due() RETURNS TABLE (woken bigint, next_due timestamptz, now timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    b smallint;
    one record;
    queues text[] := '{}';
    n bigint := 0;
    soonest timestamptz;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            FOR one IN
                WITH due AS (
                    SELECT e.id FROM workflow_executions e
                    WHERE e.bucket = b AND e.status = 'waiting' AND e.available_at <= at
                    ORDER BY e.available_at
                    LIMIT 1000
                    FOR UPDATE SKIP LOCKED
                )
                UPDATE workflow_executions e
                SET status = 'enqueued', wait_reason = NULL, updated_at = at
                FROM due
                WHERE e.bucket = b AND e.id = due.id AND e.status = 'waiting'
                RETURNING e.queue
            LOOP
                n := n + 1;
                IF NOT one.queue = ANY (queues) THEN
                    queues := queues || one.queue;
                END IF;
            END LOOP;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    -- the next wake-up: one scan of every shard, without locks
    BEGIN
        SELECT min(e.available_at) INTO soonest FROM workflow_executions e
        WHERE e.status = 'waiting' AND e.available_at > at;
    EXCEPTION WHEN connection_exception THEN
        soonest := NULL;  -- a worker node is down: the timer looks again after its poll interval
    END;
    IF cardinality(queues) > 0 THEN
        PERFORM ring_doorbells(queues);
    END IF;
    woken := n; next_due := soonest; now := at;
    RETURN NEXT;
END;
$$;

CREATE FUNCTION citus_expire_deadlines() RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    b smallint;
    late record;
    finished text[] := '{}';
    parents text[] := '{}';
    stopped text[] := '{}';
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            FOR late IN
                SELECT e.id, e.status, e.parent_id, e.deadline, e.timeout_seconds FROM workflow_executions e
                WHERE e.bucket = b AND e.deadline < at AND e.status IN ('enqueued', 'waiting', 'running')
                ORDER BY e.deadline
                LIMIT 1000
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
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    PERFORM citus_finished(finished, parents, stopped, at);
END;
$$;

CREATE FUNCTION citus_fail_unrunnable(grace double precision) RETURNS TABLE (id text, name text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    cutoff timestamptz := at - make_interval(secs => grace);
    b smallint;
    served text[];
    known text[];
    stuck record;
    finished text[] := '{}';
    parents text[] := '{}';
BEGIN
    -- the live workers, read once on the coordinator: the queues they serve, the (queue, workflow) they know
    SELECT coalesce(array_agg(DISTINCT q), '{}') INTO served
    FROM workers w, unnest(w.queues) AS q WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    IF cardinality(served) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(DISTINCT q || E'\n' || n), '{}') INTO known
    FROM workers w, unnest(w.queues) AS q, unnest(w.workflows) AS n
    WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            FOR stuck IN
                SELECT e.id, e.name, e.queue, e.parent_id FROM workflow_executions e
                WHERE e.bucket = b AND e.status = 'enqueued' AND e.available_at < cutoff
                  AND e.queue = ANY (served) AND NOT (e.queue || E'\n' || e.name) = ANY (known)
                LIMIT 1000
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
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    PERFORM citus_finished(finished, parents, NULL, at);
END;
$$;

-- == Inside workflows: one bucket per statement ==========================================================
-- The fence (the writer's attempt, still running, lease not expired, the row held FOR SHARE) and the write
-- are separate routed statements in the caller's transaction, in the execution's bucket: one node.

CREATE FUNCTION citus_fence(b smallint, execution_id text, attempt integer) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM FROM workflow_executions e
    WHERE e.bucket = b AND e.id = execution_id AND e.attempt = attempt AND e.status = 'running'
      AND e.lease_expires > now()
    FOR SHARE;
    RETURN FOUND;
END;
$$;

-- Record a step that has no output of its own (set_event, write_stream, set_tags): true if recorded now.
CREATE FUNCTION citus_record_step(b smallint, execution_id text, attempt integer, step_id integer, step_name text,
                                  output jsonb, error jsonb, started_at timestamptz, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    INSERT INTO operation_outputs (bucket, execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    VALUES (b, execution_id, step_id, step_name, output, error, 1, attempt, started_at, at)
    ON CONFLICT ON CONSTRAINT operation_outputs_pkey DO NOTHING;
    RETURN FOUND;
END;
$$;

CREATE FUNCTION citus_set_event(id text, attempt integer, step_id integer, step_name text,
                                started_at timestamptz, key text, value jsonb) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(id);
BEGIN
    IF NOT citus_fence(b, id, attempt)
       OR NOT citus_record_step(b, id, attempt, step_id, step_name, 'null', NULL, started_at, at) THEN
        RETURN 0;
    END IF;
    INSERT INTO workflow_events (bucket, execution_id, key, step_id, value, created_at)
    VALUES (b, id, key, step_id, value, at);
    PERFORM pg_notify(notify_channel('event'), id);
    RETURN 1;
END;
$$;

CREATE FUNCTION citus_write_stream(id text, attempt integer, step_id integer, step_name text,
                                   started_at timestamptz, key text, value jsonb) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(id);
BEGIN
    IF NOT citus_fence(b, id, attempt)
       OR NOT citus_record_step(b, id, attempt, step_id, step_name, 'null', NULL, started_at, at) THEN
        RETURN 0;
    END IF;
    INSERT INTO workflow_streams (bucket, execution_id, key, step_id, value, closed, created_at)
    VALUES (b, id, key, step_id, value, value IS NULL, at);
    PERFORM pg_notify(notify_channel('event'), id);
    RETURN 1;
END;
$$;

CREATE FUNCTION citus_set_tags(id text, attempt integer, step_id integer, step_name text,
                               started_at timestamptz, tags jsonb) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(id);
BEGIN
    UPDATE workflow_executions e
    SET tags = nullif(coalesce(e.tags, '{}') || tags, '{}'), updated_at = at
    WHERE e.bucket = b AND e.id = id AND e.attempt = attempt AND e.status = 'running' AND e.lease_expires > now();
    IF NOT FOUND OR NOT citus_record_step(b, id, attempt, step_id, step_name, 'null', NULL, started_at, at) THEN
        RETURN 0;
    END IF;
    RETURN 1;
END;
$$;

CREATE FUNCTION citus_receive(id text, attempt integer, topic text, step_id integer, step_name text,
                              started_at timestamptz)
RETURNS TABLE (owned bigint, wakeups bigint, got bigint, message text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(id);
    next_message record;
BEGIN
    -- (the column is "got": an OUT parameter named found would be PL/pgSQL's FOUND)
    -- the wake-up count before the lock: a send that commits while we wait for it makes the suspend that
    -- follows fail, and the workflow look again
    SELECT e.wakeups INTO wakeups FROM workflow_executions e WHERE e.bucket = b AND e.id = id;
    owned := 0; got := 0; message := NULL;
    IF NOT citus_fence(b, id, attempt) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    owned := 1;
    SELECT m.id, m.message INTO next_message FROM workflow_messages m
    WHERE m.bucket = b AND m.destination_id = id AND m.topic = topic AND m.consumed_at IS NULL
    ORDER BY m.id
    LIMIT 1
    FOR UPDATE;
    IF next_message.id IS NOT NULL
       AND citus_record_step(b, id, attempt, step_id, step_name, next_message.message, NULL, started_at, at) THEN
        -- only a message whose receive step was recorded here is consumed
        UPDATE workflow_messages m SET consumed_at = at, consumed_by_step = step_id
        WHERE m.bucket = b AND m.id = next_message.id;
        got := 1;
        message := next_message.message::text;
    END IF;
    RETURN NEXT;
END;
$$;

-- A child in its own bucket (decided by its id), most likely on another node: two-phase commit.
CREATE FUNCTION citus_enqueue_child(parent text, attempt integer, id text, name text, queue text, priority integer,
                                    input jsonb, max_recoveries integer, delay double precision,
                                    timeout double precision, concurrency_key text, trace jsonb, tags jsonb,
                                    step_id integer, step_name text, started_at timestamptz)
RETURNS TABLE (recorded bigint, created bigint, found_name text, conflict text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(parent);
    parent_deadline timestamptz;
    owned boolean;
    error jsonb;
    message text;
BEGIN
    recorded := 0; created := 0; conflict := NULL;
    SELECT e.deadline INTO parent_deadline FROM workflow_executions e
    WHERE e.bucket = b AND e.id = parent AND e.attempt = attempt AND e.status = 'running'
      AND e.lease_expires > now()
    FOR SHARE;
    owned := FOUND;
    IF owned THEN
        SELECT count(*) INTO created FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
            'id', id, 'name', name, 'queue', queue, 'priority', priority, 'input', input,
            'max_recoveries', max_recoveries, 'delay_seconds', delay, 'timeout_seconds', timeout,
            'parent_id', parent, 'deadline', parent_deadline, 'concurrency_key', concurrency_key,
            'trace_context', trace, 'tags', tags)));
    END IF;
    SELECT e.name INTO found_name FROM workflow_executions e WHERE e.bucket = bucket_of(id) AND e.id = id;
    IF created = 0 AND found_name <> name THEN
        message := format('workflow id %s already belongs to an execution of %s, not %s',
                          quote_literal(id), quote_literal(found_name), quote_literal(name));
        error := jsonb_build_object('type', 'pgdurable.errors.WorkflowIdConflict', 'message', message,
                                    'args', jsonb_build_array(message));
        conflict := error::text;
    END IF;
    IF owned AND citus_record_step(b, parent, attempt, step_id, step_name,
                                   CASE WHEN error IS NULL THEN to_jsonb(id) END, error, started_at, at) THEN
        recorded := 1;
    END IF;
    RETURN NEXT;
END;
$$;

-- The outcome of awaited executions (one routed read per bucket among them), after the waiter's wake-up
-- count: a child that finishes after the count was read bumps it, which makes the waiter's suspend fail and
-- look again. An id with no execution comes back with a NULL status.
CREATE FUNCTION citus_awaited_status(waiter text, attempt integer, ids text[])
RETURNS TABLE (wakeups bigint, id text, status text, output text, error text, is_child boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    count_seen bigint;
    group_of record;
    seen text[] := '{}';
    found_row record;
BEGIN
    SELECT w.wakeups INTO count_seen FROM workflow_executions w
    WHERE w.bucket = bucket_of(waiter) AND w.id = waiter AND w.attempt = attempt AND w.status = 'running'
      AND w.lease_expires > now();
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR group_of IN SELECT bucket_of(i) AS b, array_agg(i) AS members FROM unnest(ids) AS i GROUP BY 1 ORDER BY 1 LOOP
        FOR found_row IN
            SELECT e.id, e.status, e.output::text AS output, e.error::text AS error, e.parent_id = waiter AS is_child
            FROM workflow_executions e WHERE e.bucket = group_of.b AND e.id = ANY (group_of.members)
        LOOP
            wakeups := count_seen; id := found_row.id; status := found_row.status; output := found_row.output;
            error := found_row.error; is_child := found_row.is_child;
            RETURN NEXT;
            seen := seen || found_row.id;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT count_seen, i, NULL::text, NULL::text, NULL::text, NULL::boolean
                 FROM unnest(ids) AS i WHERE NOT i = ANY (seen);
END;
$$;

CREATE FUNCTION citus_resume(id text) RETURNS TABLE (resumed text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    at timestamptz := clock_now();
    b smallint := bucket_of(id);
    queue_name text;
    first_failed integer;
BEGIN
    SELECT e.queue INTO queue_name FROM workflow_executions e
    WHERE e.bucket = b AND e.id = id AND e.status IN ('failed', 'cancelled')
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT min(o.step_id) INTO first_failed FROM operation_outputs o
    WHERE o.bucket = b AND o.execution_id = id AND o.error IS NOT NULL;
    DELETE FROM operation_outputs o WHERE o.bucket = b AND o.execution_id = id AND o.step_id >= first_failed;
    UPDATE workflow_executions e
    SET status = 'enqueued', output = NULL, error = NULL, recoveries = 0, completed_at = NULL,
        available_at = at, updated_at = at, deadline = NULL, wait_reason = NULL
    WHERE e.bucket = b AND e.id = id;
    PERFORM ring_doorbells(ARRAY[queue_name]);
    resumed := id;
    RETURN NEXT;
END;
$$;

-- App.start: created already claimed by this process, unless its queue has a policy.
CREATE FUNCTION citus_start_owned(new_id text, workflow_name text, queue_name text, prio integer, args jsonb,
                                  recoveries integer, timeout double precision, trace jsonb, tags jsonb,
                                  owner text, lease double precision, version text)
RETURNS TABLE (id text, name text, created boolean, attempt integer, input jsonb, db_now timestamptz, owned boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := clock_now();
    limited boolean := EXISTS (SELECT 1 FROM queues q WHERE q.name = queue_name);
    made record;
BEGIN
    SELECT * INTO made FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', new_id, 'name', workflow_name, 'queue', queue_name, 'priority', prio, 'input', args,
        'max_recoveries', recoveries, 'timeout_seconds', timeout, 'trace_context', trace, 'tags', tags,
        'owner_id', CASE WHEN limited THEN NULL ELSE owner END, 'lease_seconds', lease,
        'app_version', CASE WHEN limited THEN NULL ELSE version END))) AS i;
    IF made.id IS NOT NULL THEN
        RETURN QUERY SELECT made.id, made.name, true, made.attempt, made.input, at, made.status = 'running';
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.id, e.name, false, e.attempt, e.input, at, false FROM workflow_executions e
    WHERE e.bucket = bucket_of(new_id) AND e.id = new_id;
END;
$$;

-- A fork: a new execution (in its own bucket) with the source's steps, events and streams before from_step
-- copied over (Citus moves the rows between buckets: two-phase commit when they are on two nodes).
CREATE FUNCTION citus_fork(source_id text, new_id text, from_step integer)
RETURNS TABLE (id text, name text, copied bigint, source_found boolean, recorded_steps integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    source_bucket smallint := bucket_of(source_id);
    new_bucket smallint := bucket_of(new_id);
    src record;
    made record;
BEGIN
    SELECT * INTO src FROM workflow_executions e WHERE e.bucket = source_bucket AND e.id = source_id;
    source_found := FOUND;
    SELECT coalesce(max(o.step_id) + 1, 0) INTO recorded_steps FROM operation_outputs o
    WHERE o.bucket = source_bucket AND o.execution_id = source_id;
    copied := 0;
    IF NOT source_found OR from_step > recorded_steps THEN
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO made FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', new_id, 'name', src.name, 'queue', src.queue, 'priority', src.priority, 'input', src.input,
        'max_recoveries', src.max_recoveries, 'timeout_seconds', src.timeout_seconds,
        'concurrency_key', src.concurrency_key, 'trace_context', src.trace_context, 'tags', src.tags,
        'forked_from', src.id)), raise_on_conflict => true) AS i;
    id := made.id; name := made.name;
    INSERT INTO operation_outputs (bucket, execution_id, step_id, step_name, output, error, attempts,
                                   recorded_by_attempt, started_at, completed_at)
    SELECT new_bucket, new_id, o.step_id, o.step_name, o.output, o.error, o.attempts, 0, o.started_at, o.completed_at
    FROM operation_outputs o
    WHERE o.bucket = source_bucket AND o.execution_id = source_id AND o.step_id < from_step;
    GET DIAGNOSTICS copied = ROW_COUNT;
    INSERT INTO workflow_events (bucket, execution_id, key, step_id, value, created_at)
    SELECT new_bucket, new_id, ev.key, ev.step_id, ev.value, ev.created_at FROM workflow_events ev
    WHERE ev.bucket = source_bucket AND ev.execution_id = source_id AND ev.step_id < from_step;
    INSERT INTO workflow_streams (bucket, execution_id, key, step_id, value, closed, created_at)
    SELECT new_bucket, new_id, st.key, st.step_id, st.value, st.closed, st.created_at FROM workflow_streams st
    WHERE st.bucket = source_bucket AND st.execution_id = source_id AND st.step_id < from_step;
    RETURN NEXT;
END;
$$;

-- == Versions: a loop over the buckets ===================================================================

CREATE FUNCTION citus_unpark(version text, names text[]) RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b smallint;
    lease_now timestamptz := now();
    queues text[] := '{}';
    one record;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            FOR one IN
                UPDATE workflow_executions e
                SET status = 'enqueued', wait_reason = NULL, parked_reason = NULL, available_at = lease_now,
                    updated_at = lease_now
                WHERE e.bucket = b AND e.status = 'waiting' AND e.available_at IS NULL AND e.wait_reason = 'parked'
                  AND e.app_version = version AND e.name = ANY (names)
                RETURNING e.id, e.queue
            LOOP
                id := one.id;
                RETURN NEXT;
                IF NOT one.queue = ANY (queues) THEN
                    queues := queues || one.queue;
                END IF;
            END LOOP;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    IF cardinality(queues) > 0 THEN
        PERFORM ring_doorbells(queues);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION migrate_app_version(old_version text, new_version text) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    b smallint;
    moved bigint := 0;
    in_bucket bigint;
    lease_now timestamptz := now();
    queues text[];
BEGIN
    IF old_version IS NULL OR new_version IS NULL OR new_version = '' THEN
        RAISE EXCEPTION 'migrate_app_version: both versions must be given (got % and %)', old_version, new_version
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH b IN ARRAY citus_buckets() LOOP
        UPDATE workflow_executions e
        SET app_version = new_version,
            status = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN 'enqueued' ELSE e.status END,
            available_at = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN lease_now
                                ELSE e.available_at END,
            parked_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL
                                 ELSE e.parked_reason END,
            wait_reason = CASE WHEN e.wait_reason = 'parked' AND e.status = 'waiting' THEN NULL ELSE e.wait_reason END,
            updated_at = lease_now
        WHERE e.bucket = b AND e.app_version = old_version AND e.status IN ('enqueued', 'waiting', 'running')
          AND (old_version <> new_version OR (e.status = 'waiting' AND e.wait_reason = 'parked'));
        GET DIAGNOSTICS in_bucket = ROW_COUNT;
        moved := moved + in_bucket;
    END LOOP;
    IF moved > 0 THEN
        SELECT array_agg(DISTINCT w.q) INTO queues FROM workers, unnest(workers.queues) AS w(q);
        IF queues IS NOT NULL THEN
            PERFORM ring_doorbells(queues);
        END IF;
    END IF;
    RETURN moved;
END;
$$;

-- The per-version counts: the executions' aggregated over every shard first, then joined with the workers.
CREATE OR REPLACE FUNCTION app_versions()
RETURNS TABLE (app_version text, enqueued bigint, waiting bigint, running bigint, parked bigint,
               live_workers bigint)
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    WITH unfinished AS MATERIALIZED (
        SELECT e.app_version,
               count(*) FILTER (WHERE e.status = 'enqueued') AS enqueued,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason IS DISTINCT FROM 'parked') AS waiting,
               count(*) FILTER (WHERE e.status = 'running') AS running,
               count(*) FILTER (WHERE e.status = 'waiting' AND e.wait_reason = 'parked') AS parked
        FROM workflow_executions e
        WHERE e.status IN ('enqueued', 'waiting', 'running') AND e.app_version IS NOT NULL
        GROUP BY e.app_version
    ), live AS MATERIALIZED (
        SELECT w.app_version, count(*) AS live_workers
        FROM workers w
        WHERE w.app_version IS NOT NULL AND worker_alive(w.heartbeat_at, w.lease_seconds)
        GROUP BY w.app_version
    )
    SELECT coalesce(u.app_version, l.app_version), coalesce(u.enqueued, 0), coalesce(u.waiting, 0),
           coalesce(u.running, 0), coalesce(u.parked, 0), coalesce(l.live_workers, 0)
    FROM unfinished u FULL JOIN live l ON l.app_version = u.app_version
    ORDER BY 1;
END;
$$;

-- == Retention: per bucket ================================================================================
-- What may be deleted is what cleanup_count and cleanup_batch of queries/retention.sql delete on a single node:
-- finished before the cutoff, and not the child of an unfinished parent (looked up in the parent's bucket).

CREATE FUNCTION citus_deletable(b smallint, cutoff timestamptz, statuses text[], lim integer, lock boolean)
RETURNS TABLE (id text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    candidate record;
    taken integer := 0;
BEGIN
    FOR candidate IN
        SELECT e.id, e.parent_id FROM workflow_executions e
        WHERE e.bucket = b AND e.created_at < cutoff AND coalesce(e.completed_at, e.updated_at) < cutoff
          AND e.status = ANY (statuses) AND e.status IN ('succeeded', 'failed', 'cancelled')
        ORDER BY e.created_at
        LIMIT lim
    LOOP
        EXIT WHEN taken >= lim;
        CONTINUE WHEN candidate.parent_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM workflow_executions p
            WHERE p.bucket = bucket_of(candidate.parent_id) AND p.id = candidate.parent_id
              AND p.status IN ('enqueued', 'waiting', 'running'));
        IF lock THEN
            -- re-checked on the locked row; a row another transaction holds is skipped
            PERFORM FROM workflow_executions e
            WHERE e.bucket = b AND e.id = candidate.id AND e.status IN ('succeeded', 'failed', 'cancelled')
            FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
        END IF;
        id := candidate.id;
        taken := taken + 1;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE FUNCTION citus_cleanup_count(cutoff timestamptz, statuses text[]) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    b smallint;
    total bigint := 0;
    in_bucket bigint;
BEGIN
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            SELECT count(*) INTO in_bucket FROM citus_deletable(b, cutoff, statuses, 2147483647, false);
            total := total + in_bucket;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    RETURN total;
END;
$$;

CREATE FUNCTION citus_cleanup_batch(cutoff timestamptz, statuses text[], lim integer)
RETURNS TABLE (executions bigint, steps bigint, messages bigint, events bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    b smallint;
    doomed text[];
    n bigint;
BEGIN
    executions := 0; steps := 0; messages := 0; events := 0;
    FOREACH b IN ARRAY citus_buckets() LOOP
        BEGIN
            EXIT WHEN executions >= lim;
            SELECT array_agg(d.id) INTO doomed FROM citus_deletable(b, cutoff, statuses, lim - executions::integer, true) d;
            CONTINUE WHEN doomed IS NULL;
            DELETE FROM operation_outputs o WHERE o.bucket = b AND o.execution_id = ANY (doomed);
            GET DIAGNOSTICS n = ROW_COUNT;
            steps := steps + n;
            DELETE FROM workflow_messages m WHERE m.bucket = b AND m.destination_id = ANY (doomed);
            GET DIAGNOSTICS n = ROW_COUNT;
            messages := messages + n;
            DELETE FROM workflow_events v WHERE v.bucket = b AND v.execution_id = ANY (doomed);
            GET DIAGNOSTICS n = ROW_COUNT;
            events := events + n;
            DELETE FROM workflow_streams st WHERE st.bucket = b AND st.execution_id = ANY (doomed);
            DELETE FROM workflow_executions e WHERE e.bucket = b AND e.id = ANY (doomed);
            GET DIAGNOSTICS n = ROW_COUNT;
            executions := executions + n;
        EXCEPTION WHEN connection_exception THEN
            NULL;  -- its worker node is down: the other buckets are served
        END;
    END LOOP;
    RETURN NEXT;
END;
$$;

-- == Executions no live worker will run ====================================================================
-- The view of the same name joins the executions with the workers (a coordinator table), which Citus refuses:
-- the live workers are read first, into arrays, and every shard is then read once against them.
CREATE FUNCTION citus_unrunnable()
RETURNS TABLE (id text, name text, queue text, created_at timestamptz, reason text)
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    served text[];
    known text[];
    runs text[];
BEGIN
    SELECT coalesce(array_agg(DISTINCT q), '{}') INTO served
    FROM workers w, unnest(w.queues) AS q WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    -- (queue, workflow), and (queue, workflow, version) of the versions run ('*': a worker that adopts any)
    SELECT coalesce(array_agg(DISTINCT q || E'\n' || n), '{}'),
           coalesce(array_agg(DISTINCT q || E'\n' || n || E'\n'
                              || CASE WHEN w.adopt_after_seconds IS NOT NULL THEN '*'
                                      ELSE coalesce(w.app_version, '') END), '{}')
    INTO known, runs
    FROM workers w, unnest(w.queues) AS q, unnest(w.workflows) AS n
    WHERE worker_alive(w.heartbeat_at, w.lease_seconds);
    RETURN QUERY
    SELECT e.id, e.name, e.queue, e.created_at,
           CASE WHEN e.status = 'waiting'
                THEN 'parked: ' || coalesce(e.parked_reason, 'its history does not replay on the code that claimed it')
                WHEN NOT e.queue = ANY (served) THEN 'no live worker serves queue ' || e.queue
                WHEN NOT (e.queue || E'\n' || e.name) = ANY (known)
                THEN 'no live worker on queue ' || e.queue || ' knows workflow ' || e.name
                ELSE 'no live worker runs application version ' || e.app_version || ' or adopts other versions'
           END
    FROM workflow_executions e
    WHERE (e.status = 'enqueued'
           AND NOT (e.queue || E'\n' || e.name || E'\n*') = ANY (runs)
           AND (e.app_version IS NOT NULL OR NOT (e.queue || E'\n' || e.name) = ANY (known))
           AND (e.app_version IS NULL OR NOT (e.queue || E'\n' || e.name || E'\n' || e.app_version) = ANY (runs)))
       OR (e.status = 'waiting' AND e.wait_reason = 'parked' AND e.available_at IS NULL);
END;
$$;

CREATE OR REPLACE VIEW unrunnable_executions AS
SELECT u.id, u.name, u.queue, u.created_at, u.reason FROM citus_unrunnable() AS u;

REVOKE ALL ON FUNCTION bucket_of(text), citus_buckets(), citus_refuse(text), citus_bindable(regclass), citus_finished(text[], text[], text[], timestamptz),
    citus_claim(smallint, text, text[], text, double precision, integer, text, double precision),
    citus_write_steps(jsonb), citus_write_completions(jsonb), citus_heartbeat(text, double precision, text[]),
    citus_release(text, text[]), citus_load_steps(text[]), citus_sweep_expired(), citus_wake_due(),
    citus_expire_deadlines(), citus_fail_unrunnable(double precision), citus_fence(smallint, text, integer),
    citus_record_step(smallint, text, integer, integer, text, jsonb, jsonb, timestamptz, timestamptz),
    citus_set_event(text, integer, integer, text, timestamptz, text, jsonb),
    citus_write_stream(text, integer, integer, text, timestamptz, text, jsonb),
    citus_set_tags(text, integer, integer, text, timestamptz, jsonb),
    citus_receive(text, integer, text, integer, text, timestamptz),
    citus_enqueue_child(text, integer, text, text, text, integer, jsonb, integer, double precision,
                        double precision, text, jsonb, jsonb, integer, text, timestamptz),
    citus_awaited_status(text, integer, text[]), citus_resume(text), citus_fork(text, text, integer),
    citus_unpark(text, text[]), citus_deletable(smallint, timestamptz, text[], integer, boolean),
    citus_cleanup_count(timestamptz, text[]), citus_cleanup_batch(timestamptz, text[], integer),
    citus_start_owned(text, text, text, integer, jsonb, integer, double precision, jsonb, jsonb, text,
                      double precision, text)
    FROM PUBLIC;
