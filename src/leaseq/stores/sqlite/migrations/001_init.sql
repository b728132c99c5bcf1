-- Jobs of every queue. Timestamps are Unix seconds (REAL) from SQLite's own clock.
CREATE TABLE IF NOT EXISTS leaseq_jobs (
    queue         TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    task          TEXT,
    status        TEXT    NOT NULL,
    payload       TEXT    NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    max_attempts  INTEGER NOT NULL,
    lease_until   REAL,
    lease_epoch   INTEGER NOT NULL DEFAULT 0,
    worker_id     TEXT,
    error         TEXT,
    failure       TEXT,
    revision      TEXT,
    stale         INTEGER NOT NULL DEFAULT 0,
    result        TEXT,
    result_key    TEXT,
    created_at    REAL    NOT NULL,
    updated_at    REAL    NOT NULL,
    first_seen_at REAL    NOT NULL,
    published_at  REAL,
    PRIMARY KEY (queue, id)
) WITHOUT ROWID;

-- The claim scans this index in not-before order; it holds only live jobs with attempts left,
-- so a large done / failed history never slows the claim down.
CREATE INDEX IF NOT EXISTS leaseq_jobs_claimable
    ON leaseq_jobs (queue, lease_until, id)
    WHERE status IN ('pending', 'processing') AND attempts < max_attempts;

-- reclaim_expired walks the leased jobs in lease order.
CREATE INDEX IF NOT EXISTS leaseq_jobs_leased
    ON leaseq_jobs (queue, lease_until)
    WHERE status = 'processing';

CREATE INDEX IF NOT EXISTS leaseq_jobs_status
    ON leaseq_jobs (queue, status, updated_at);

CREATE TABLE IF NOT EXISTS leaseq_journal (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    queue       TEXT    NOT NULL,
    job_id      TEXT    NOT NULL,
    at          REAL    NOT NULL,
    event       TEXT    NOT NULL,
    attempt     INTEGER,
    lease_epoch INTEGER,
    worker_id   TEXT,
    reason      TEXT,
    data        TEXT
);

CREATE INDEX IF NOT EXISTS leaseq_journal_job ON leaseq_journal (queue, job_id, seq);
