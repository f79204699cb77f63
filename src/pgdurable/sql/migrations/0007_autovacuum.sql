-- pgdurable schema, version 7: vacuum the execution table early. Every execution's row is updated several
-- times (claim, heartbeats, completion, waits), so dead versions pile up at the rate of the work, while
-- the table's default trigger (20% of its rows dead) grows with the history kept: with a million finished
-- executions, vacuum would wait for 200,000 dead rows. A fixed, small trigger keeps the claim path's
-- indexes and heap compact whatever the history. (Per-table settings; your server-wide ones still apply
-- to everything else.)
ALTER TABLE workflow_executions SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

ALTER TABLE queue_slots SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 500);
