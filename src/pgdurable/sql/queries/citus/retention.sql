-- The Citus layout's versions of the named queries of ../retention.sql (see executions.sql here): one bucket
-- at a time, each candidate's parent looked up in its own bucket.

-- name: cleanup_count
SELECT citus_cleanup_count(%(cutoff)s, %(statuses)s);

-- name: cleanup_batch
SELECT executions, steps, messages, events FROM citus_cleanup_batch(%(cutoff)s, %(statuses)s, %(limit)s);
