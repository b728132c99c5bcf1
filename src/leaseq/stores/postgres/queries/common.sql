-- PostgreSQL queries of leaseq. {jobs} and {journal} are the store's schema-qualified tables,
-- {schema} the quoted schema (to name an index in it); {now} is the server's clock plus the
-- test-only offset `off`. now() is the transaction's start, so every use in one transaction
-- agrees.
--
-- Every state change writes its journal rows in the same statement (a data-modifying CTE),
-- so a change and its event commit together and cost one round trip.
-- A fenced finish reads the row FOR UPDATE in a CTE (`old`) and then runs one of several
-- UPDATEs whose conditions exclude each other: the stale one gives the job back for its new
-- revision (restarted), the others finish.

-- name: now
SELECT {now} AS now;

-- A loose index scan over the primary key: one index probe per queue, from each queue name to
-- the next, instead of reading every job (SELECT DISTINCT scans the whole table). The
-- sweeper and the metrics ask.
-- name: queues
WITH RECURSIVE q(queue) AS (
    SELECT min(queue) FROM {jobs}
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL)
SELECT queue FROM q WHERE queue IS NOT NULL;
