-- Named queries about Citus (distributed PostgreSQL): see citus.py and docs/scale-out.md.

-- name: citus_installed
-- Whether the connected database has the citus extension (then it is a Citus coordinator or node).
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: citus_defer_propagation
-- For the rest of the migration's transaction: create objects on the coordinator only. Citus otherwise
-- propagates every CREATE FUNCTION to the worker nodes at once, and then refuses a later ALTER FUNCTION ... SET
-- search_path FROM CURRENT on it (migration 0008): "unsupported ALTER FUNCTION ... SET ... FROM CURRENT for a
-- distributed function".
SET LOCAL citus.create_object_propagation = 'deferred';
