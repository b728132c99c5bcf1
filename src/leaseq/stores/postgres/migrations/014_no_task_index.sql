-- jobs_task (migration 007) served one reader, the job browser's filter by task alone, and
-- cost every enqueue, claim and finish an entry (a claim or a finish is no HOT update, so each
-- adds one): about a ninth of a 1,000-job batch enqueue statement. The browser now walks the
-- primary key for that filter, in the same id order, checking each row's task: a page reads
-- at most browse.SCAN_CAP rows, so a rare task's jobs take more pages, not a slower one. A
-- filter by status and task walks jobs_status, as before. (The SQLite and MongoDB stores keep
-- their task index: no producer there is held to a peer's enqueue rate.)
-- A plain DROP: it waits for the transactions using the table, then takes no time.
DROP INDEX IF EXISTS {schema}.jobs_task;
