-- The worker registry: one row per live worker, upserted by its heartbeat thread every few
-- seconds and deleted on a clean stop; the sweeper prunes workers that stopped beating.
CREATE TABLE {schema}.workers (
    worker_id    text COLLATE "C" PRIMARY KEY,
    queues       json        NOT NULL,
    in_flight    integer     NOT NULL,
    started_at   timestamptz NOT NULL,
    last_beat_at timestamptz NOT NULL
);

-- The job browser's filter by task, in id order. A task is written at enqueue (and by a new
-- revision) only; still, a claim or a finish changes other indexed columns, so no such update
-- is HOT and each adds an entry here too (one index insert per state change).
CREATE INDEX jobs_task ON {schema}.jobs (queue, task, id);

-- Journal counts per hour (throughput and failures over the last hour): a range of one
-- queue's events by time, read from the index alone.
CREATE INDEX journal_at ON {schema}.journal (queue, at, event);

-- The job browser walks one status newest first with (updated_at, id) as its keyset: the
-- status index gains id so that walk needs no sort (one index either way, so the cost of a
-- state change is unchanged). It still serves counts, purge and the reclaim of spent jobs.
DROP INDEX {schema}.jobs_status;
CREATE INDEX jobs_status ON {schema}.jobs (queue, status, updated_at, id);
