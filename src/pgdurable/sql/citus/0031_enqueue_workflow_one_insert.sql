-- The Citus layout, version 31 (recorded in schema_migrations as 10031): enqueue_workflow's insert, routed.
--
-- The single-node migration of this number gives enqueue_workflow insert_execution_v1, a plain INSERT into
-- workflow_executions. On this layout a row needs its bucket, which the layout's insert_executions_v2 fills
-- (sql/citus/0018): here insert_execution_v1 goes through that function, as enqueue_workflow did before.
-- (enqueue_workflow itself is the single node's, which Citus propagates to the worker nodes.)
CREATE OR REPLACE FUNCTION insert_execution_v1(
    new_id text, workflow_name text, input jsonb, queue text, priority integer, max_recoveries integer,
    start_at timestamptz, timeout_seconds double precision, dedup_key text, concurrency_key text, tags jsonb
) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM FROM insert_executions_v2(jsonb_build_array(jsonb_build_object(
        'id', new_id, 'name', workflow_name, 'input', input, 'queue', queue, 'priority', priority,
        'max_recoveries', max_recoveries, 'start_at', start_at, 'timeout_seconds', timeout_seconds,
        'dedup_key', dedup_key, 'concurrency_key', concurrency_key, 'tags', tags)));
    RETURN FOUND;
END;
$$;
