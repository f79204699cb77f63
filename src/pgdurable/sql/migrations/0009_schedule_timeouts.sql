-- pgdurable schema, version 9: a schedule's ticks carry the workflow's time budget, as every other way of
-- creating an execution does (an enqueue, a child, a fork, the SQL function).
ALTER TABLE schedules
    ADD COLUMN timeout_seconds double precision CHECK (timeout_seconds > 0 AND timeout_seconds <= 315360000);
