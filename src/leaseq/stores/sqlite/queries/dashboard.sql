-- SQLite queries of leaseq: dashboard (placeholders as described in common.sql).

-- Hours are whole multiples of 3,600 s since the epoch (UTC). Every event but the enqueues
-- and claims (journal.HOURLY_UNCOUNTED), written as in the partial index leaseq_journal_at's
-- definition (migration 008), which SQLite uses only when the query implies it.
-- name: journal_hourly
SELECT CAST(at / 3600 AS INTEGER) * 3600 AS hour, event, count(*) AS n
FROM leaseq_journal
WHERE queue = :queue AND event NOT IN ({event.enqueued}, {event.claimed})
  AND at >= (CAST({now} / 3600 AS INTEGER) - :hours + 1) * 3600
GROUP BY hour, event
ORDER BY hour, event;

-- The same events in a window that ends now (the overview's "last hour"), by the same index.
-- name: journal_counts
SELECT event, count(*) AS n
FROM leaseq_journal
WHERE queue = :queue AND event NOT IN ({event.enqueued}, {event.claimed})
  AND at >= {now} - :within_s
GROUP BY event;

-- Bounded counts for the overview and doctor: at most :cap index entries each.
-- name: count_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM leaseq_jobs WHERE queue = :queue AND status = :status LIMIT :cap);

-- name: lapsed_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM leaseq_jobs
    WHERE queue = :queue AND status = 'processing' AND lease_until < {now} LIMIT :cap);

-- name: ready_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    LIMIT :cap);

-- The first claimable job in not-before order is the one ready longest.
-- name: oldest_ready
SELECT {now} - lease_until AS age FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY lease_until
LIMIT 1;
