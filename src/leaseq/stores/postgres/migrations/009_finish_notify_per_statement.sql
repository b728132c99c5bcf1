-- The finish NOTIFY of 008, sent once per statement instead of once per row. A row trigger
-- ran a PL/pgSQL call and queued a notification for every finished job: a fifth of a batch
-- completion's cost. Now each statement that updates jobs hands its new rows (a transition
-- table) to one call, which sends the keys of the rows it left terminal, space-separated, 200
-- per notification (33 bytes each: well under the 8,000-byte payload limit). A row updated
-- again while already terminal is sent again: a waiter's wake-up is a hint (it reads the
-- job), so that costs a read, never a wrong answer. Transition tables cannot go with a column
-- list, so every UPDATE of jobs calls it; for a claim or a heartbeat it finds nothing to send.
DROP TRIGGER jobs_notify_finish ON {schema}.jobs;
DROP FUNCTION {schema}.notify_finish();

CREATE FUNCTION {schema}.notify_finishes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lqdone_' || TG_TABLE_SCHEMA, string_agg(key, ' '))
    FROM (SELECT md5(queue || '/' || id) AS key, (row_number() OVER ()) / 200 AS chunk
          FROM new_rows WHERE status NOT IN ('pending', 'processing')) finished
    GROUP BY chunk;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_finishes
    AFTER UPDATE ON {schema}.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.notify_finishes();
