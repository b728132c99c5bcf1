-- The schedule ledger: one row per schedule, apart from the jobs, so a retention purge never
-- lets an old tick fire again. `cursor`: every tick at or before it is decided; `version`: the
-- compare-and-set token of every advance, pause, resume and change.
CREATE TABLE {schema}.schedules (
    name        text COLLATE "C" PRIMARY KEY,
    queue       text COLLATE "C" NOT NULL,
    spec        text        NOT NULL,
    cursor      timestamptz NOT NULL,
    version     bigint      NOT NULL DEFAULT 0,
    last_tick   timestamptz,
    last_job_id text COLLATE "C",
    skipped     bigint      NOT NULL DEFAULT 0,
    paused      boolean     NOT NULL DEFAULT false,
    active      boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
