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

-- Only jobs with a key: a key-limited claim walks the keys (one seek each), counts each key's
-- running jobs and takes its first ready ones. Jobs on their last attempt stay in it, so a
-- running one is still counted.
CREATE INDEX leaseq_jobs_keyed
    ON leaseq_jobs (queue, concurrency_key, priority DESC, lease_until, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'processing');

-- One row per rate-limited queue: the store-clock stamps of its last rate_per_s claims, a
-- JSON array, oldest first. BEGIN IMMEDIATE serialises the claims that read and write it.
CREATE TABLE IF NOT EXISTS leaseq_limits (
    queue  TEXT PRIMARY KEY,
    recent TEXT NOT NULL DEFAULT '[]'
) WITHOUT ROWID;
