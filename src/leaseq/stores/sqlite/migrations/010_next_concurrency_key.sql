-- A new revision that arrives while its job runs (a stale job) may name another concurrency
-- key. The running attempt keeps the old key (its key's running count must not move); the new
-- one waits here and becomes the job's key when the old attempt ends: its worker's finish
-- (given back), a reclaim or a claim of its lapsed lease, an operator's cancel. Read only
-- while `stale`; a stale job from before this column keeps its key. A payload may not use the
-- name at its top level (leaseq.validate.RESERVED_KEYS: a MongoDB record sits beside it).
ALTER TABLE leaseq_jobs ADD COLUMN next_concurrency_key TEXT;
UPDATE leaseq_jobs SET next_concurrency_key = concurrency_key WHERE stale;
