-- The outbox's own walk: due jobs the broker has not been told about, in not-before order.
-- In broker mode most pending jobs are published and only wait for a consumer; walking them
-- in leaseq_jobs_claimable to find the few still owed cost a step per published job on every
-- dispatcher round. This index holds only the jobs still owed a publish (without a broker:
-- every pending job, one more index entry per enqueue and retry, none per claim or finish).
CREATE INDEX IF NOT EXISTS leaseq_jobs_outbox
    ON leaseq_jobs (queue, lease_until, id)
    WHERE status = 'pending' AND published_at IS NULL AND attempts < max_attempts;
