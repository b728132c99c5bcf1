-- A NOTIFY when a job reaches a terminal status, so a caller waiting on its result
-- (Queue.wait, Queue.await_result) wakes at the finish's commit instead of polling. A trigger,
-- so every path to a finish (complete, fail, an exhausted retry, cancel, an expired lease) is
-- covered in the same transaction, and a rolled-back finish notifies nobody. The channel is
-- 'lqdone_<schema>', apart from the enqueue wake-ups' so a worker's listener never hears
-- finishes; the payload md5(queue || '/' || id) is of fixed size (an id may exceed a NOTIFY
-- payload's 8,000 bytes). The cost is one queued notification per finished job.
CREATE OR REPLACE FUNCTION {schema}.notify_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lqdone_' || TG_TABLE_SCHEMA, md5(NEW.queue || '/' || NEW.id));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_finish
    AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('pending', 'processing') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {schema}.notify_finish();
