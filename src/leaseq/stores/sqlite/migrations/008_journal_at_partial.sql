-- leaseq_journal_at serves one reader, the hourly counts (journal_hourly), which no longer
-- count the enqueues and claims (leaseq.journal.HOURLY_UNCOUNTED): one row per enqueue and one
-- per claim, the two events a busy queue writes most, read by no hourly figure. The index
-- leaves them out too, so an enqueue and a claim each write one index entry fewer. SQLite uses
-- a partial index only when the query's WHERE implies its predicate: journal_hourly writes
-- the same condition.
DROP INDEX IF EXISTS leaseq_journal_at;
CREATE INDEX IF NOT EXISTS leaseq_journal_at ON leaseq_journal (queue, at, event)
    WHERE event NOT IN ('enqueued', 'claimed');
