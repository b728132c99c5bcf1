-- The worker registry: one row per live worker, upserted by its heartbeat thread every few
-- seconds and deleted on a clean stop; the sweeper prunes workers that stopped beating.
CREATE TABLE IF NOT EXISTS leaseq_workers (
    worker_id    TEXT    PRIMARY KEY,
    queues       TEXT    NOT NULL,
    in_flight    INTEGER NOT NULL,
    started_at   REAL    NOT NULL,
    last_beat_at REAL    NOT NULL
) WITHOUT ROWID;

-- The job browser's filter by task, in id order. A task is written at enqueue (and by a new
-- revision) only, so this index costs nothing on a claim or a finish.
CREATE INDEX IF NOT EXISTS leaseq_jobs_task ON leaseq_jobs (queue, task, id);

-- Journal counts per hour (throughput and failures over the last hour): a range of one
-- queue's events by time, read from the index alone.
CREATE INDEX IF NOT EXISTS leaseq_journal_at ON leaseq_journal (queue, at, event);
