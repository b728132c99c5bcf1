-- PostgreSQL queries of leaseq: dashboard (placeholders as described in common.sql).

-- Every event but the enqueues and claims (journal.HOURLY_UNCOUNTED): the partial index
-- journal_at (migration 013) holds exactly these, so the condition on event is written as in
-- its definition, for the planner to match.
-- name: journal_hourly
SELECT date_trunc('hour', at, 'UTC') AS hour, event, count(*) AS n
FROM {journal}
WHERE queue = %(queue)s AND event NOT IN ({event.enqueued}, {event.claimed})
  AND at >= date_trunc('hour', {now}, 'UTC') - make_interval(hours => %(hours)s - 1)
GROUP BY 1, 2
ORDER BY 1, 2;

-- The same events in a window that ends now (the overview's "last hour"), by the same index.
-- name: journal_counts
SELECT event, count(*) AS n
FROM {journal}
WHERE queue = %(queue)s AND event NOT IN ({event.enqueued}, {event.claimed})
  AND at >= {now} - make_interval(secs => %(within_s)s)
GROUP BY event;

-- Bounded counts for the overview and doctor: at most "cap" index entries each.
-- name: count_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s LIMIT %(cap)s) AS c;

-- The planner's row estimate for one status (run with client-side parameters: EXPLAIN
-- takes no server-side ones), shown instead of a count past the cap.
-- name: estimate_status
EXPLAIN (FORMAT JSON) SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s;

-- name: lapsed_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs}
    WHERE queue = %(queue)s AND status = 'processing' AND lease_until < {now}
    LIMIT %(cap)s) AS c;

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

-- Estimated bloat of each btree index of the store's schema (doctor's index_bloat check), from
-- the catalog alone: no read of the index, no extension (pgstattuple's pgstatindex() is exact
-- but reads every page). The method of ioguix's "btree bloat" query: a fresh build puts the
-- index's entries (pg_class.reltuples) on leaf pages of block_size less the 24-byte page header
-- and the 16-byte btree special space, filled to the index's fillfactor (default 90), plus the
-- metapage; the pages it has beyond that (pg_class.relpages) are the estimated bloat. An entry
-- is a 4-byte line pointer, an 8-byte tuple header (16 with a null bitmap) and its columns'
-- average widths from pg_stats, MAXALIGNed to 8 (a 64-bit server); a variable-width key ends
-- anywhere in its last 8-byte word, so such an entry is counted half a word longer.
-- Limits: as fresh as the last VACUUM or ANALYZE (an index with a column never analyzed is left
-- out); padding between columns and internal pages are not counted (a few per cent too much
-- bloat).
-- Errors the other way only hide bloat: a partial index counts its columns' nulls as full width
-- (its predicate may exclude them), and deduplication (PostgreSQL 13+) packs repeated keys, so
-- an index of few distinct keys is smaller than this expects.
-- name: index_health
WITH idx AS (
    SELECT i.indexrelid, i.indrelid, i.indkey::int2[] AS keys, i.indpred IS NOT NULL AS partial,
           c.relname AS index, t.relname AS tbl, c.relpages, c.reltuples,
           coalesce((SELECT o.option_value::int FROM pg_options_to_table(c.reloptions) AS o
                     WHERE o.option_name = 'fillfactor'), 90) AS fillfactor
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_am am ON am.oid = c.relam
    WHERE n.nspname = %(schema)s AND am.amname = 'btree' AND c.relpages > 0 AND c.reltuples >= 0
), cols AS (
    -- One row per column of each index; an expression's statistics are kept under the index.
    SELECT idx.indexrelid, s.null_frac > 0 AS nulls, a.attlen < 0 AS varies,
           CASE WHEN idx.partial THEN s.avg_width ELSE (1 - s.null_frac) * s.avg_width END AS width
    FROM idx
    CROSS JOIN LATERAL unnest(idx.keys) WITH ORDINALITY AS k(attnum, pos)
    JOIN pg_attribute a
      ON a.attrelid = CASE k.attnum WHEN 0 THEN idx.indexrelid ELSE idx.indrelid END
     AND a.attnum = CASE k.attnum WHEN 0 THEN k.pos ELSE k.attnum END
    LEFT JOIN pg_stats s
      ON s.schemaname = %(schema)s AND s.attname = a.attname AND NOT s.inherited
     AND s.tablename = CASE k.attnum WHEN 0 THEN idx.index ELSE idx.tbl END
), entry AS (
    -- An index with a column not analyzed yet has no width to go by: left out.
    SELECT indexrelid,
           4 + CASE WHEN bool_or(nulls) THEN 16 ELSE 8 END
             + ceil((sum(width) + CASE WHEN bool_or(varies) THEN 4 ELSE 0 END) / 8) * 8 AS bytes
    FROM cols
    GROUP BY indexrelid
    HAVING count(width) = count(*)
), expected AS (
    SELECT idx.index, idx.tbl, idx.relpages, bs,
           1 + ceil(idx.reltuples / greatest(
               floor((bs - 24 - 16) * idx.fillfactor / 100.0 / entry.bytes), 1)) AS pages
    FROM idx
    JOIN entry USING (indexrelid)
    CROSS JOIN (SELECT current_setting('block_size')::int AS bs) AS b
)
SELECT index, tbl AS table_name, relpages::bigint * bs AS size_bytes,
       greatest(relpages - pages, 0)::bigint * bs AS bloat_bytes
FROM expected
ORDER BY index;
