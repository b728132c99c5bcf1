-- Each claim call stamps the jobs it takes with a token of its own. A claim whose connection
-- was lost while it committed is not run again blindly: the retry ends the lost session and
-- reads back the jobs under the token (queries/claim.sql, claimed_by_token), which otherwise
-- would stay `processing` under a worker that never got them, an attempt spent, until their
-- lease ran out. No index: the read-back walks the queue's processing jobs (jobs_status), as
-- many as run at once, and only after such a loss.
ALTER TABLE {schema}.jobs ADD COLUMN claim_token uuid;
