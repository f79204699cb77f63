-- Named queries on table bindings (migration 0015). The connection's search_path is the pgdurable schema,
-- then public: an unqualified table name is looked up there.

-- name: table_columns
-- The columns of a table, to match them with a workflow's parameters.
SELECT a.attname::text FROM pg_attribute a
WHERE a.attrelid = %(table)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: bind_table
SELECT bind_table(%(table)s::regclass, %(workflow_name)s, %(operations)s::text[], %(when_condition)s,
                  %(name)s, %(columns)s::text[], %(pass_old)s, %(queue)s, %(priority)s, %(max_recoveries)s,
                  %(timeout_seconds)s);

-- name: list_table_bindings
SELECT * FROM list_table_bindings();

-- name: unbind_table
SELECT unbind_table(%(name)s);

-- name: restore_table_bindings
SELECT restore_table_bindings();
