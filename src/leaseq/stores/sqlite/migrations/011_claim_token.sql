-- The token of the claim that holds a job, new at every claim (leaseq.job.Lease). It tells
-- apart two claims the epoch and the worker cannot: a job deleted and enqueued again while a
-- worker runs it starts its epochs again, and the same worker may claim the new life in
-- another slot. A job claimed before this column has none, and its lease checks none.
ALTER TABLE leaseq_jobs ADD COLUMN claim_token TEXT;
