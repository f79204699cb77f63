-- pgdurable schema, version 27: an enqueue that rings a doorbell only reads it; the worker disarms it.
--
-- ring_doorbells used to disarm the bells it rang (UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)), so
-- that later enqueues would not notify again. That made every ring a row write in the application's
-- transaction, and it skipped a bell its worker was arming at that moment (the arming claim holds the row
-- lock until it commits): such an enqueue rang nobody, and its work waited for the claim that closes the
-- arming's gap. Now a ring is a look and a NOTIFY, and the worker disarms its own bell: on a single node in
-- the claim that finds work (the named query "claim"), elsewhere in a statement of its own when a ring woke
-- it. Workers of the previous release still disarm nothing themselves: while they run, an enqueue into a
-- queue where one of them sleeps notifies until that worker claims again, which costs wake-ups, not work.
CREATE OR REPLACE FUNCTION ring_doorbells(queues text[]) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    notified bigint;
BEGIN
    SELECT count(pg_notify(notify_channel('work'), q.queue)) INTO notified
    FROM (SELECT DISTINCT b.queue FROM worker_doorbells b WHERE b.queue = ANY (queues) AND b.armed) AS q;
    RETURN notified;
END;
$$;
