-- Jobs of every queue, in the store's schema ({schema} is the quoted schema name).
-- Timestamps are timestamptz from the server's clock. Payload and result are `json`, not
-- `jsonb`: `json` keeps the exact text leaseq wrote (key order, \u0000 escapes) so a replay
-- compares equal and a payload comes back unchanged.
-- Ids and queue names use the "C" collation: ordering and paging compare code points, as on
-- every other store, whatever the database's locale.
CREATE TABLE {schema}.jobs (
    queue         text COLLATE "C" NOT NULL,
    id            text COLLATE "C" NOT NULL,
    task          text,
    status        text        NOT NULL,
    payload       json        NOT NULL,
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL,
    lease_until   timestamptz,
    lease_epoch   bigint      NOT NULL DEFAULT 0,
    worker_id     text,
    error         text,
    failure       text,
    revision      text,
    stale         boolean     NOT NULL DEFAULT false,
    result        json,
    result_key    text,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    first_seen_at timestamptz NOT NULL,
    published_at  timestamptz,
    PRIMARY KEY (queue, id)
);

-- The claim walks this index in not-before order. Pending jobs always carry a not-before
-- (enqueue time + delay), so one index serves both branches of the claimable predicate, and it
-- holds only live jobs with attempts left: a large done / failed history never slows a claim.
CREATE INDEX jobs_claimable
    ON {schema}.jobs (queue, lease_until, id)
    WHERE status IN ('pending', 'processing') AND attempts < max_attempts;

-- Counts, purge by status and age, reclaim of spent jobs.
CREATE INDEX jobs_status ON {schema}.jobs (queue, status, updated_at);

CREATE TABLE {schema}.journal (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text COLLATE "C" NOT NULL,
    job_id      text COLLATE "C" NOT NULL,
    at          timestamptz NOT NULL,
    event       text        NOT NULL,
    attempt     integer,
    lease_epoch bigint,
    worker_id   text,
    reason      text,
    data        json
);

CREATE INDEX journal_job ON {schema}.journal (queue, job_id, seq);
