-- SQLite queries of leaseq. {now} is SQLite's own clock in Unix seconds plus the test-only
-- offset :off; it is the same value for every use inside one statement.

-- name: now
SELECT {now} AS now;

-- A loose index scan: one index seek per queue, from each queue name to the next, instead of
-- reading every job (SELECT DISTINCT walks the whole index). The sweeper and the metrics ask.
-- name: queues
WITH RECURSIVE q(queue) AS (
    SELECT min(queue) FROM leaseq_jobs
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq_jobs j WHERE j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL)
SELECT queue FROM q WHERE queue IS NOT NULL;
