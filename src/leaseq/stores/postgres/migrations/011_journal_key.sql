-- The journal is read by job only (queue, job_id in seq order: journal_job), so its primary
-- key becomes that index: every journal row (three per finished job: enqueued, claimed and
-- what ended the attempt) then maintains one B-tree fewer. `seq` stays an identity column and
-- keeps the order of each job's events; the key still identifies a row (for logical
-- replication's replica identity, among others). Built in the migration's transaction: writes
-- to the journal wait while the new key is built (seconds per million rows).
ALTER TABLE {schema}.journal DROP CONSTRAINT journal_pkey;
DROP INDEX {schema}.journal_job;
ALTER TABLE {schema}.journal ADD CONSTRAINT journal_pkey PRIMARY KEY (queue, job_id, seq);
