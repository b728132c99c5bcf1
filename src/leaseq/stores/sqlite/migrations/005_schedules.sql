-- The schedule ledger: one row per schedule, apart from the jobs, so a retention purge never
-- lets an old tick fire again. `cursor`: every tick at or before it is decided; `version`: the
-- compare-and-set token of every advance, pause, resume and change. Unix seconds (REAL).
CREATE TABLE IF NOT EXISTS leaseq_schedules (
    name        TEXT    NOT NULL PRIMARY KEY,
    queue       TEXT    NOT NULL,
    spec        TEXT    NOT NULL,
    cursor      REAL    NOT NULL,
    version     INTEGER NOT NULL DEFAULT 0,
    last_tick   REAL,
    last_job_id TEXT,
    skipped     INTEGER NOT NULL DEFAULT 0,
    paused      INTEGER NOT NULL DEFAULT 0,
    active      INTEGER NOT NULL DEFAULT 1,
    created_at  REAL    NOT NULL,
    updated_at  REAL    NOT NULL
) WITHOUT ROWID;
