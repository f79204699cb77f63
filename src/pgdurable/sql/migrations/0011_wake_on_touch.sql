-- pgdurable schema, version 11: an enqueued execution whose row another transaction held while a worker
-- claimed (a send bumping its wake-up count, a child finishing) was passed over by the claim (SKIP LOCKED),
-- and since its status did not change, no NOTIFY followed that transaction's commit: it waited for the next
-- poll although workers were idle. Such an update now wakes the workers of its queue too.
CREATE TRIGGER workflow_executions_notify_touched
    AFTER UPDATE OF wakeups ON workflow_executions
    FOR EACH ROW WHEN (OLD.status = 'enqueued' AND NEW.status = 'enqueued')
    EXECUTE FUNCTION notify_execution_change();
