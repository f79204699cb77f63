-- pgdurable schema, version 15: table-bound workflows. bind_table() installs a trigger on an application's
-- table that enqueues a workflow for every matching row change, inside the writing transaction, with the
-- row's columns as the workflow's arguments by name. The trigger is the binding (it works whatever happens
-- to the table_bindings row); table_bindings records each binding so that it can be listed, checked (is its
-- trigger still there?) and re-created.

-- One row per binding.
CREATE TABLE table_bindings (
    -- The binding's name: the trigger is "pgdurable:<name>" and the executions' ids begin "bind:<name>:".
    name            text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,50}$'),
    -- The table, schema-qualified, as it was named when bound (a later rename does not update it; the
    -- trigger follows the table).
    relation        text        NOT NULL,
    workflow_name   text        NOT NULL CHECK (length(workflow_name) BETWEEN 1 AND 200),
    -- Which changes fire it: a non-empty subset of insert, update, delete.
    operations      text[]      NOT NULL,
    -- The trigger's WHEN clause (a boolean SQL expression on NEW and OLD), if any.
    when_condition  text,
    -- The primary key's columns, in key order: with the transaction, they identify a change.
    key_columns     text[]      NOT NULL,
    -- The columns passed as arguments (NULL: every column).
    columns         text[],
    -- Also pass the row before the change as the argument "old" (NULL for an insert).
    pass_old        boolean     NOT NULL DEFAULT false,
    queue           text        NOT NULL DEFAULT 'default' CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    priority        integer     NOT NULL DEFAULT 0,
    max_recoveries  integer     NOT NULL DEFAULT 5 CHECK (max_recoveries >= 0),
    timeout_seconds double precision CHECK (timeout_seconds > 0 AND timeout_seconds <= 315360000),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The trigger function of every binding. Its one argument is the binding as JSON (name, key, columns,
-- pass_old, and "common": the execution's workflow name, queue, priority, max_recoveries, timeout), so
-- firing reads no table. SECURITY DEFINER (owned by the engine's owner): the role that writes the bound
-- table needs no rights on the engine's tables. Nobody but the engine's owner and worker roles may attach
-- it to a table (EXECUTE is revoked from PUBLIC; PostgreSQL checks it when a trigger is created).
--
-- A change is identified by the binding, the row's primary key, the operation and the transaction (its id
-- and start time: an id alone repeats after a dump and restore into a new cluster). That makes the
-- execution id deterministic: a trigger that fires again for the same change finds its execution already
-- there. A row changed again by the same operation in the same transaction is the same change: its
-- execution, still uncommitted and unclaimed, gets the row's latest version (and keeps, as "old", the row
-- as it was before the transaction's first change).
CREATE FUNCTION table_binding_fire() RETURNS trigger
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
        UPDATE workflow_executions e
        SET input = CASE WHEN (binding ->> 'pass_old')::boolean
                         THEN arguments || jsonb_build_object('old', e.input -> 'old') ELSE arguments END,
            updated_at = now()
        WHERE e.id = new_id AND e.status = 'enqueued' AND e.attempt = 0;
    END IF;
    RETURN NULL;
END;
$$;

-- Bind a table to a workflow: from now on (in this transaction, if it commits), every change of a row of
-- ``target`` by one of ``operations`` for which ``when_condition`` holds enqueues ``workflow_name`` with
-- the row's ``columns`` (all if NULL) as its arguments by name. Binding again under the same name replaces
-- the binding (its trigger is re-created). Runs with the caller's rights: the caller needs the TRIGGER
-- privilege on the table (its owner has it) and to be the engine's owner or a worker role. Returns the
-- binding's name (by default "<table>:<workflow>", characters outside [A-Za-z0-9_.:-] made "_").
--
-- ``when_condition`` is SQL written by the developer, like a migration (never pass end users' input): it
-- becomes the trigger's WHEN clause, which PostgreSQL parses and type-checks as one boolean expression.
CREATE FUNCTION bind_table(
    target          regclass,
    workflow_name   text,
    operations      text[]           DEFAULT '{insert}',
    when_condition  text             DEFAULT NULL,
    binding_name    text             DEFAULT NULL,
    columns         text[]           DEFAULT NULL,
    pass_old        boolean          DEFAULT false,
    queue           text             DEFAULT 'default',
    priority        integer          DEFAULT 0,
    max_recoveries  integer          DEFAULT 5,
    timeout_seconds double precision DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    fire constant regprocedure := to_regprocedure('table_binding_fire()');
    relation_kind "char";
    qualified text;
    key_columns text[];
    unknown text[];
    ops text[];
    binding text;
    trigger_name text;
    existing record;
    config jsonb;
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'bind_table: target must name a table' USING ERRCODE = '22023';
    END IF;
    SELECT c.relkind, format('%I.%I', n.nspname, c.relname) INTO relation_kind, qualified
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target;
    IF relation_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'bind_table: % is not a table', target USING ERRCODE = '42809';
    END IF;
    -- pgdurable's own tables: an execution's insert would fire the trigger that inserts it, and so on.
    IF (SELECT c.relnamespace FROM pg_class c WHERE c.oid = target) = current_schema()::regnamespace THEN
        RAISE EXCEPTION 'bind_table: % is one of pgdurable''s own tables', target USING ERRCODE = '42809';
    END IF;
    IF workflow_name IS NULL OR length(workflow_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'bind_table: workflow_name must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'bind_table: queue % is not a valid queue name', quote_nullable(queue)
            USING ERRCODE = '22023', HINT = '1 to 100 letters, digits, or _ . : -';
    END IF;
    IF priority IS NULL OR max_recoveries IS NULL OR max_recoveries < 0 THEN
        RAISE EXCEPTION 'bind_table: priority must be given and max_recoveries must be >= 0'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT (timeout_seconds > 0 AND timeout_seconds <= 315360000) THEN
        RAISE EXCEPTION 'bind_table: timeout_seconds % must be a finite number of seconds, > 0 and <= '
                        '315360000 (10 years)', timeout_seconds
            USING ERRCODE = '22023';
    END IF;

    -- The primary key identifies the row of a change.
    SELECT array_agg(a.attname::text ORDER BY k.n) INTO key_columns
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = target AND i.indisprimary;
    IF key_columns IS NULL THEN
        RAISE EXCEPTION 'bind_table: table % has no primary key', target
            USING ERRCODE = '55000',
                  HINT = 'a binding identifies each change by the row''s primary key (it makes the execution '
                         'id deterministic); add one';
    END IF;

    SELECT array_agg(DISTINCT lower(o)) INTO ops FROM unnest(operations) AS o;
    IF ops IS NULL OR NOT ops <@ ARRAY['insert', 'update', 'delete'] THEN
        RAISE EXCEPTION 'bind_table: operations must be a non-empty list of insert, update, delete, not %',
                        coalesce(operations::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;

    IF columns IS NOT NULL THEN
        SELECT array_agg(c) INTO unknown FROM unnest(columns) AS c
        WHERE c IS NULL OR NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = target AND a.attname = c
                                                                    AND a.attnum > 0 AND NOT a.attisdropped);
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'bind_table: table % has no column(s) %', target, unknown USING ERRCODE = '42703';
        END IF;
    END IF;
    IF pass_old AND (CASE WHEN columns IS NULL
                          THEN EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = target AND a.attname = 'old'
                                                                  AND a.attnum > 0 AND NOT a.attisdropped)
                          ELSE 'old' = ANY (columns) END) THEN
        RAISE EXCEPTION 'bind_table: table % has a column "old", which pass_old would overwrite', target
            USING ERRCODE = '22023', HINT = 'pass the columns without "old", or do not pass the old row';
    END IF;

    -- A cheap guard against a WHEN clause that smuggles in a second statement. The clause is also set on
    -- lines of its own, so a trailing comment cannot swallow the rest of the statement, and the trigger
    -- is checked below to run table_binding_fire.
    IF position(';' IN coalesce(when_condition, '')) > 0 THEN
        RAISE EXCEPTION 'bind_table: the when condition must be one SQL expression, without ";"'
            USING ERRCODE = '42601';
    END IF;
    IF when_condition IS NOT NULL AND btrim(when_condition) = '' THEN
        when_condition := NULL;
    END IF;

    binding := coalesce(binding_name,
                        left(regexp_replace((SELECT c.relname FROM pg_class c WHERE c.oid = target) || ':'
                                            || workflow_name, '[^A-Za-z0-9_.:-]', '_', 'g'), 50));
    IF binding !~ '^[A-Za-z0-9_.:-]{1,50}$' THEN
        RAISE EXCEPTION 'bind_table: binding name % is not valid', quote_nullable(binding)
            USING ERRCODE = '22023', HINT = '1 to 50 letters, digits, or _ . : -';
    END IF;
    trigger_name := 'pgdurable:' || binding;

    -- Binding again replaces the binding on the same table; a name bound to another table is refused.
    FOR existing IN SELECT t.tgrelid FROM pg_trigger t WHERE t.tgname = trigger_name AND t.tgfoid = fire LOOP
        IF existing.tgrelid <> target THEN
            RAISE EXCEPTION 'bind_table: binding % already binds table %', binding, existing.tgrelid::regclass
                USING ERRCODE = '42710', HINT = 'unbind it first, or choose another binding name';
        END IF;
        EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, target);
    END LOOP;

    config := jsonb_build_object(
        'name', binding, 'key', to_jsonb(key_columns), 'columns', to_jsonb(columns), 'pass_old', pass_old,
        'common', jsonb_build_object('name', workflow_name, 'queue', queue, 'priority', priority,
                                     'max_recoveries', max_recoveries, 'timeout_seconds', timeout_seconds));
    EXECUTE format(E'CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW %s EXECUTE FUNCTION %I.table_binding_fire(%L)',
                   trigger_name, array_to_string(ARRAY(SELECT upper(o) FROM unnest(ops) AS o ORDER BY o), ' OR '),
                   target, CASE WHEN when_condition IS NOT NULL THEN E'WHEN (\n' || when_condition || E'\n)' ELSE '' END,
                   current_schema(), config::text);
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = target AND t.tgname = trigger_name AND t.tgfoid = fire) THEN
        RAISE EXCEPTION 'bind_table: the when condition changed the trigger''s definition: %', when_condition
            USING ERRCODE = '42601';
    END IF;

    INSERT INTO table_bindings AS b (name, relation, workflow_name, operations, when_condition, key_columns, columns,
                                     pass_old, queue, priority, max_recoveries, timeout_seconds)
    VALUES (binding, qualified, workflow_name, ops, when_condition, key_columns, columns, pass_old, queue,
            priority, max_recoveries, timeout_seconds)
    ON CONFLICT (name) DO UPDATE
    SET relation = EXCLUDED.relation, workflow_name = EXCLUDED.workflow_name, operations = EXCLUDED.operations,
        when_condition = EXCLUDED.when_condition, key_columns = EXCLUDED.key_columns, columns = EXCLUDED.columns,
        pass_old = EXCLUDED.pass_old, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
        max_recoveries = EXCLUDED.max_recoveries, timeout_seconds = EXCLUDED.timeout_seconds, updated_at = now();
    RETURN binding;
END;
$$;

-- Remove a binding: drop its trigger (the caller must own the table) and its row. True if either existed.
-- Executions it already enqueued are left alone.
CREATE FUNCTION unbind_table(binding_name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    fire constant regprocedure := to_regprocedure('table_binding_fire()');
    installed record;
    found_any boolean := false;
BEGIN
    FOR installed IN SELECT t.tgrelid, t.tgname FROM pg_trigger t
                     WHERE t.tgname = 'pgdurable:' || binding_name AND t.tgfoid = fire LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', installed.tgname, installed.tgrelid::regclass);
        found_any := true;
    END LOOP;
    DELETE FROM table_bindings b WHERE b.name = binding_name;
    RETURN found_any OR FOUND;
END;
$$;

-- Every binding, with the table its trigger is on now (NULL: the trigger is gone, e.g. the table was
-- dropped; bind again or unbind).
CREATE FUNCTION list_table_bindings()
RETURNS TABLE (name text, relation text, workflow_name text, operations text[], when_condition text,
               key_columns text[], columns text[], pass_old boolean, queue text, priority integer,
               max_recoveries integer, timeout_seconds double precision, installed_on text,
               created_at timestamptz, updated_at timestamptz)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    SELECT b.name, b.relation, b.workflow_name, b.operations, b.when_condition, b.key_columns, b.columns,
           b.pass_old, b.queue, b.priority, b.max_recoveries, b.timeout_seconds,
           (SELECT t.tgrelid::regclass::text FROM pg_trigger t
            WHERE t.tgname = 'pgdurable:' || b.name AND t.tgfoid = to_regprocedure('table_binding_fire()')
            LIMIT 1),
           b.created_at, b.updated_at
    FROM table_bindings b
    ORDER BY b.name;
$$;

-- Re-create the trigger of every binding whose trigger is gone while its table exists (the table was
-- dropped and created again, or restored without its triggers), from its record. Returns their names.
CREATE FUNCTION restore_table_bindings() RETURNS SETOF text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    missing record;
BEGIN
    FOR missing IN SELECT l.* FROM list_table_bindings() l
                   WHERE l.installed_on IS NULL AND to_regclass(l.relation) IS NOT NULL
                   ORDER BY l.name LOOP
        RETURN NEXT bind_table(missing.relation::regclass, missing.workflow_name, missing.operations,
                               missing.when_condition, missing.name, missing.columns, missing.pass_old,
                               missing.queue, missing.priority, missing.max_recoveries, missing.timeout_seconds);
    END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION table_binding_fire(), bind_table(regclass, text, text[], text, text, text[], boolean, text,
                                                        integer, integer, double precision),
                       unbind_table(text), list_table_bindings(), restore_table_bindings()
    FROM PUBLIC;
