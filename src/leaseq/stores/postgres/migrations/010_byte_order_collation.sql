-- The indexed text columns that 001 left in the database's default collation compare bytes
-- from now on, like queue, id and concurrency_key always did. Under a locale collation
-- (en_US.UTF-8, or C.UTF-8 before PostgreSQL 17) each comparison in jobs_status, jobs_task,
-- the partial indexes' status predicates and journal_at went through strcoll: measured, a
-- tenth of a claim's and a completion's time. Task names and event names sort by their bytes
-- now (the job browser's task filter order). No table is rewritten; the indexes on these
-- columns are rebuilt in the migration's transaction (seconds per million rows, during which
-- writes wait).
ALTER TABLE {schema}.jobs
    ALTER COLUMN status TYPE text COLLATE "C",
    ALTER COLUMN task TYPE text COLLATE "C";
ALTER TABLE {schema}.journal
    ALTER COLUMN event TYPE text COLLATE "C";
