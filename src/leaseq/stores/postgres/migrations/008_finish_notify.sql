-- A NOTIFY when a job reaches a terminal status, so a caller waiting on its result
-- (Queue.wait, Queue.await_result) wakes at the finish's commit instead of polling. A trigger,
-- so every path to a finish (complete, fail, an exhausted retry, cancel, an expired lease) is
-- covered in the same transaction, and a rolled-back finish notifies nobody. The payload is
-- '=' + md5(queue || '/' || id): fixed size (an id may exceed a NOTIFY payload's 8,000 bytes)
-- and never a queue name (the enqueue wake-ups' payload on the same channel). The cost is one
-- queued notification per finished job, deduplicated within a transaction.
CREATE OR REPLACE FUNCTION {schema}.notify_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leaseq_' || TG_TABLE_SCHEMA, '=' || md5(NEW.queue || '/' || NEW.id));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_finish
    AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('pending', 'processing') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {schema}.notify_finish();
