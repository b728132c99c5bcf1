-- Snoozes and give-backs are counted on the record, so each can be bounded by the policy.
ALTER TABLE leaseq_jobs ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leaseq_jobs ADD COLUMN givebacks INTEGER NOT NULL DEFAULT 0;

-- A new revision now resets the budget, a running (stale) one included: its running attempt
-- belongs to the old revision. Bring jobs marked stale before this version in line.
UPDATE leaseq_jobs SET attempts = 0 WHERE status = 'processing' AND stale = 1;

-- The sweeper's third step looks for pending jobs that can never be claimed (attempts spent,
-- written before a new revision reset them). The index holds only those, so it is empty and
-- free in a healthy queue.
CREATE INDEX IF NOT EXISTS leaseq_jobs_spent_pending
    ON leaseq_jobs (queue)
    WHERE status = 'pending' AND attempts >= max_attempts;
