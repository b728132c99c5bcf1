-- SQLite queries of leaseq: workers (placeholders as described in common.sql).

-- name: register_worker
INSERT INTO leaseq_workers (worker_id, queues, in_flight, started_at, last_beat_at)
VALUES (:worker_id, :queues, :in_flight, {now}, {now})
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, in_flight = excluded.in_flight,
    last_beat_at = excluded.last_beat_at;

-- name: unregister_worker
DELETE FROM leaseq_workers WHERE worker_id = :worker_id;

-- name: list_workers
SELECT * FROM leaseq_workers ORDER BY worker_id LIMIT :limit;

-- name: prune_workers
DELETE FROM leaseq_workers WHERE last_beat_at < {now} - :older_than_s RETURNING worker_id;
