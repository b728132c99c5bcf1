-- PostgreSQL queries of leaseq: workers (placeholders as described in common.sql).

-- name: register_worker
INSERT INTO {workers} (worker_id, queues, in_flight, started_at, last_beat_at)
VALUES (%(worker_id)s, %(queues)s::json, %(in_flight)s, {now}, {now})
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, in_flight = excluded.in_flight,
    last_beat_at = excluded.last_beat_at;

-- name: unregister_worker
DELETE FROM {workers} WHERE worker_id = %(worker_id)s;

-- name: list_workers
SELECT * FROM {workers} ORDER BY worker_id LIMIT %(limit)s;

-- name: prune_workers
WITH gone AS (
    DELETE FROM {workers} WHERE last_beat_at < {now} - make_interval(secs => %(older_than_s)s)
    RETURNING 1)
SELECT count(*) AS n FROM gone;
