-- The jobs table is stored in the order its rows were written, not in id order. It was
-- WITHOUT ROWID, keyed by (queue, id), so its rows lay in the ids' text order. A claim takes
-- jobs in not-before order, which is mostly enqueue order, and with ids whose text order is not
-- that (random ids such as UUIDs, or "j9" after "j10") every job a claim or a finish touched sat
-- on a page of its own: a drain with random ids ran at half the rate of one with ordered ids,
-- and a 1,000,000-job backlog at two thirds of a small one (docs/benchmarks.md, "Ids and
-- pages"). As a rowid table, the rows of jobs enqueued together share pages whatever their ids.
-- (queue, id) stays the key: the PRIMARY KEY of a rowid table is a unique index, which a claim
-- or a finish reads but never writes (neither changes an id).
--
-- SQLite cannot change a table's kind in place, so the table is rebuilt (the way
-- https://sqlite.org/lang_altertable.html describes), its rows copied in the order they were
-- created, and its indexes made again, each as its latest migration left it. The copy holds the
-- write lock for as long as it takes (about a second per 100,000 jobs). It must never run
-- twice: after 010 it would drop that migration's column. schema.apply records the version
-- first, under the write lock, so a process that raced another to migrate skips it.
CREATE TABLE leaseq_jobs_by_row (
    queue           TEXT    NOT NULL,
    id              TEXT    NOT NULL,
    task            TEXT,
    status          TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    lease_until     REAL,
    lease_epoch     INTEGER NOT NULL DEFAULT 0,
    worker_id       TEXT,
    error           TEXT,
    failure         TEXT,
    revision        TEXT,
    stale           INTEGER NOT NULL DEFAULT 0,
    result          TEXT,
    result_key      TEXT,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL,
    first_seen_at   REAL    NOT NULL,
    published_at    REAL,
    snoozes         INTEGER NOT NULL DEFAULT 0,
    givebacks       INTEGER NOT NULL DEFAULT 0,
    priority        INTEGER NOT NULL DEFAULT 0,
    concurrency_key TEXT,
    PRIMARY KEY (queue, id)
);

INSERT INTO leaseq_jobs_by_row (
    queue, id, task, status, payload, attempts, max_attempts, lease_until, lease_epoch,
    worker_id, error, failure, revision, stale, result, result_key, created_at, updated_at,
    first_seen_at, published_at, snoozes, givebacks, priority, concurrency_key)
SELECT queue, id, task, status, payload, attempts, max_attempts, lease_until, lease_epoch,
       worker_id, error, failure, revision, stale, result, result_key, created_at, updated_at,
       first_seen_at, published_at, snoozes, givebacks, priority, concurrency_key
FROM leaseq_jobs
ORDER BY created_at, queue, id;

DROP TABLE leaseq_jobs;
ALTER TABLE leaseq_jobs_by_row RENAME TO leaseq_jobs;

-- The indexes, as 001, 002, 003, 006 and 007 made them (their comments are there).
CREATE INDEX leaseq_jobs_leased
    ON leaseq_jobs (queue, lease_until)
    WHERE status = 'processing';
CREATE INDEX leaseq_jobs_status
    ON leaseq_jobs (queue, status, updated_at);
CREATE INDEX leaseq_jobs_spent_pending
    ON leaseq_jobs (queue)
    WHERE status = 'pending' AND attempts >= max_attempts;
CREATE INDEX leaseq_jobs_outbox
    ON leaseq_jobs (queue, lease_until, id)
    WHERE status = 'pending' AND published_at IS NULL AND attempts < max_attempts;
CREATE INDEX leaseq_jobs_claimable
    ON leaseq_jobs (queue, priority DESC, lease_until, id)
    WHERE status IN ('pending', 'processing') AND attempts < max_attempts;
CREATE INDEX leaseq_jobs_keyed
    ON leaseq_jobs (queue, concurrency_key, priority DESC, lease_until, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'processing');
CREATE INDEX leaseq_jobs_keyed_running
    ON leaseq_jobs (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'processing';
CREATE INDEX leaseq_jobs_task ON leaseq_jobs (queue, task, id);
