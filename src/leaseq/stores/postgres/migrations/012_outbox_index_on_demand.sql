-- jobs_outbox (migration 003) serves one reader, the broker-mode dispatcher's outbox_due, but
-- without a broker every pending job is in it: one more index insert per enqueue and retry,
-- paid for nothing (a 1,000-job bulk enqueue statement: 12.7 ms with it, 11.7 ms without).
-- The dispatcher now builds it when it starts (PostgresStore.prepare_outbox, with the
-- definition in queries/outbox.sql), so only a schema that runs a dispatcher pays for it. A
-- dispatcher already running when this migration drops the index walks jobs_claimable (slower
-- with a large published backlog, still correct) until it is restarted.
-- A plain DROP: migrations run in one transaction, where CONCURRENTLY is refused. It waits for
-- the transactions using the table (holding up new ones meanwhile), then takes no time.
DROP INDEX IF EXISTS {schema}.jobs_outbox;
