-- pgdurable schema, version 4: cron schedules. Needs only versions 1 and 2.
-- Every worker fires due schedules: it locks them (FOR UPDATE SKIP LOCKED), enqueues one execution per due
-- tick with a deterministic id, and advances next_fire_at, all in one transaction, so each tick fires once.

CREATE TABLE schedules (
    name              text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    workflow_name     text        NOT NULL CHECK (length(workflow_name) BETWEEN 1 AND 200),
    -- 5 fields, 6 with seconds first, or @hourly/@daily/...; validated by pgdurable when written through its
    -- API. A row edited by hand into something invalid is paused by the first worker that meets it.
    cron              text        NOT NULL,
    -- An IANA zone name: the cron's wall-clock times are read in it (daylight saving time included).
    timezone          text        NOT NULL DEFAULT 'UTC',
    queue             text        NOT NULL DEFAULT 'default' CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    priority          integer     NOT NULL DEFAULT 0,
    max_recoveries    integer     NOT NULL DEFAULT 5 CHECK (max_recoveries >= 0),
    -- The workflow's keyword arguments.
    args              jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
    -- Also pass the tick's time (UTC, ISO 8601) as the keyword argument scheduled_at.
    pass_scheduled_at boolean     NOT NULL DEFAULT false,
    -- After downtime: 'skip' fires only the missed ticks late by less than the misfire grace (60 s),
    -- 'all' fires every missed tick.
    catch_up          text        NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('skip', 'all')),
    paused            boolean     NOT NULL DEFAULT false,
    -- The earliest instant whose tick has not fired yet: due ticks are those in [next_fire_at, now()].
    -- NULL: the next worker to look sets it to the first tick after its now() (handy for rows inserted by
    -- hand).
    next_fire_at      timestamptz,
    last_fired_at     timestamptz,
    -- Why a worker paused this schedule (its row was invalid); cleared when it is resumed or redefined.
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- When the definition last changed (firing does not count).
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- The firing query and the workers' wake-up time: active schedules by next fire time (unset ones first).
CREATE INDEX schedules_due_idx ON schedules (next_fire_at NULLS FIRST) WHERE NOT paused;

-- Wake the workers' firing loops when a schedule may have become due sooner than they planned (a new one,
-- a resumed one, an earlier next_fire_at); firing only moves next_fire_at later, so it does not notify.
CREATE FUNCTION notify_schedule_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_schedules', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER schedules_notify_insert
    AFTER INSERT ON schedules
    FOR EACH ROW WHEN (NOT NEW.paused)
    EXECUTE FUNCTION notify_schedule_change();

CREATE TRIGGER schedules_notify_update
    AFTER UPDATE ON schedules
    FOR EACH ROW WHEN (NOT NEW.paused AND (OLD.paused OR NEW.next_fire_at IS NULL
                                           OR NEW.next_fire_at < OLD.next_fire_at))
    EXECUTE FUNCTION notify_schedule_change();

-- Roles given the worker grant before this table existed fire schedules too: give them the same rights here
-- (grant_worker_role grants on the tables that exist when it is called).
DO $$
DECLARE
    grantee_name text;
BEGIN
    FOR grantee_name IN
        SELECT DISTINCT pg_get_userbyid(acl.grantee)
        FROM pg_class c, aclexplode(c.relacl) AS acl
        WHERE c.oid = 'workflow_executions'::regclass AND acl.privilege_type = 'UPDATE'
          AND acl.grantee <> 0 AND acl.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO %I', grantee_name);
    END LOOP;
END;
$$;
