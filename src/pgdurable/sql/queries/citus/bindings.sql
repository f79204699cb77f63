-- The Citus layout's versions of the named queries of ../bindings.sql (see executions.sql here).

-- name: bind_table
-- Refused for a distributed or reference table (citus_bindable raises), before anything is bound.
SELECT CASE WHEN citus_bindable(%(table)s::regclass)
            THEN bind_table(%(table)s::regclass, %(workflow_name)s, %(operations)s::text[], %(when_condition)s,
                            %(name)s, %(columns)s::text[], %(pass_old)s, %(queue)s, %(priority)s,
                            %(max_recoveries)s, %(timeout_seconds)s) END;
