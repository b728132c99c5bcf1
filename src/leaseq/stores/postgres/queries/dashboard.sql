-- PostgreSQL queries of leaseq: dashboard (placeholders as described in common.sql).

-- name: journal_hourly
SELECT date_trunc('hour', at, 'UTC') AS hour, event, count(*) AS n
FROM {journal}
WHERE queue = %(queue)s
  AND at >= date_trunc('hour', {now}, 'UTC') - make_interval(hours => %(hours)s - 1)
GROUP BY 1, 2
ORDER BY 1, 2;

-- Bounded counts for the overview and doctor: at most "cap" index entries each.
-- name: count_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s LIMIT %(cap)s) AS c;

-- The planner's row estimate for one status (run with client-side parameters: EXPLAIN
-- takes no server-side ones), shown instead of a count past the cap.
-- name: estimate_status
EXPLAIN (FORMAT JSON) SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s;

-- name: ready_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs}
    WHERE queue = %(queue)s
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    LIMIT %(cap)s) AS c;

-- name: oldest_ready
SELECT extract(epoch FROM {now} - lease_until)::float8 AS age FROM {jobs}
WHERE queue = %(queue)s
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY lease_until
LIMIT 1;

-- Dead rows per table of the store's schema (doctor's bloat check): the statistics views,
-- no scan of the tables themselves.
-- name: table_health
SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS size_bytes,
       greatest(last_vacuum, last_autovacuum) AS last_vacuum
FROM pg_stat_user_tables
WHERE schemaname = %(schema)s
ORDER BY relname;
