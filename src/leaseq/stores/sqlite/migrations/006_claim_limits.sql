-- Limits in the claim (docs/limits.md): a priority, a concurrency key, a log per queue for
-- the rate limit.
ALTER TABLE leaseq_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_jobs ADD COLUMN concurrency_key TEXT;

-- The claim walks live jobs highest priority first, then in not-before order. With one
-- priority (the common case) this reads exactly as the index it replaces: the due jobs come
-- first and the walk stops at its limit.
DROP INDEX IF EXISTS leaseq_jobs_claimable;
CREATE INDEX leaseq_jobs_claimable
    ON leaseq_jobs (queue, priority DESC, lease_until, id)
    WHERE status IN ('pending', 'processing') AND attempts < max_attempts;

-- Only live jobs with a key: a key-limited claim walks the keys (one seek each) and takes
-- each key's first ready jobs.
CREATE INDEX leaseq_jobs_keyed
    ON leaseq_jobs (queue, concurrency_key, priority DESC, lease_until, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'processing');

-- A key's running jobs, counted by every key-limited claim: only keyed jobs that are
-- processing, so a count reads about key_limit entries however long the key's backlog.
CREATE INDEX leaseq_jobs_keyed_running
    ON leaseq_jobs (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'processing';

-- One row per limited queue: the limits its claims last ran with (what `leaseq status` and
-- the metrics count held-back jobs by), and `recent`, the store-clock stamps of its last
-- rate_per_s claims, a JSON array, oldest first. BEGIN IMMEDIATE serialises the claims that
-- read and write it.
CREATE TABLE IF NOT EXISTS leaseq_limits (
    queue      TEXT PRIMARY KEY,
    recent     TEXT NOT NULL DEFAULT '[]',
    key_limit  INTEGER,
    rate_per_s INTEGER
) WITHOUT ROWID;
