-- Limits in the claim (docs/limits.md): a priority, a concurrency key, a row per queue that
-- serialises its limited claims and keeps its rate log. Built in the migration's transaction:
-- writes to the table wait while the indexes are built (seconds per million jobs).
ALTER TABLE {schema}.jobs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.jobs ADD COLUMN concurrency_key text COLLATE "C";

-- The claim walks live jobs highest priority first, then in not-before order. With one
-- priority (the common case) it reads exactly as the index it replaces: the due jobs come
-- first and the walk stops at its limit.
DROP INDEX {schema}.jobs_claimable;
CREATE INDEX jobs_claimable
    ON {schema}.jobs (queue, priority DESC, lease_until, id)
    WHERE status IN ('pending', 'processing') AND attempts < max_attempts;

-- Only live jobs with a key: a key-limited claim walks the keys (one probe each) and takes
-- each key's first ready jobs.
CREATE INDEX jobs_keyed
    ON {schema}.jobs (queue, concurrency_key, priority DESC, lease_until, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'processing');

-- A key's running jobs, counted by every key-limited claim: only keyed jobs that are
-- processing, so a count reads about key_limit entries however long the key's backlog.
CREATE INDEX jobs_keyed_running
    ON {schema}.jobs (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'processing';

-- One row per limited queue: a limited claim locks it first, so the counts it reads next are
-- true until it commits. `recent`: the store-clock stamps (Unix seconds) of the queue's last
-- rate_per_s claims, oldest first; key_limit, rate_per_s: the limits its claims last ran with
-- (what `leaseq status` and the metrics count held-back jobs by).
CREATE TABLE {schema}.limits (
    queue      text COLLATE "C" PRIMARY KEY,
    recent     float8[] NOT NULL DEFAULT '{}',
    key_limit  integer,
    rate_per_s integer
);
