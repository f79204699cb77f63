-- pgdurable schema, version 27: an enqueue that rings a doorbell only reads it; the worker disarms it.
--
-- ring_doorbells used to disarm the bells it rang (UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)), so
-- that later enqueues would not notify again: every ring was a row lock and a write in the application's
-- transaction. Now a ring is a look and a NOTIFY, and the worker disarms its own bell: on a single node in the
-- claim that finds work (the named query "claim"), elsewhere in a statement of its own after a ring. A worker
-- of the previous release never disarms its bells itself: until it is replaced, every enqueue into a queue
-- it has slept on notifies, which costs wake-ups and contention (as before doorbells), never work.
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
