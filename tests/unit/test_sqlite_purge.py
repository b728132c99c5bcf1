"""SQLite's purge deletes a job's journal with the job, never the one without the other: the
two deletes read the clock once between them, so a job that comes of age while the purge runs
is either kept whole or purged whole."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import leaseq

BAND_S = 4.0


def test_a_purge_over_jobs_coming_of_age_leaves_no_journal_without_its_job(
        tmp_path: Path) -> None:
    # Given 20,000 done jobs whose updated_at spreads over 4 s across the purge's cutoff (a
    # purge takes a fraction of that: thousands come of age while it runs; the cutoff starts
    # 1 s into the band, so a loaded machine's delay before the purge starts cannot take it
    # past the band: with 0.2 s, one purged every job)
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        q = store.queue("q")
        n = 20_000
        q.enqueue_many([q.spec(f"j{i:06d}", {}) for i in range(n)])
        conn = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
        start = 1_000_000.0  # a fixed past instant
        conn.execute("BEGIN")
        conn.executemany("UPDATE leaseq_jobs SET status = 'done', updated_at = ? "
                         "WHERE queue = 'q' AND id = ?",
                         [(start + i * (BAND_S / n), f"j{i:06d}") for i in range(n)])
        conn.execute("COMMIT")
        age_s = 100.0
        store.time_offset_s = (start + 1.0 + age_s) - time.time()  # the cutoff in the band
        # When they are purged
        purged = q.purge(done=age_s)
        # Then every journal row left belongs to a job left, and the purge counted its jobs
        orphans = conn.execute(
            "SELECT count(*) FROM leaseq_journal j WHERE NOT EXISTS (SELECT 1 FROM "
            "leaseq_jobs x WHERE x.queue = j.queue AND x.id = j.job_id)").fetchone()[0]
        left = conn.execute("SELECT count(*) FROM leaseq_jobs").fetchone()[0]
        conn.close()
        assert orphans == 0
        assert 0 < purged < n and purged + left == n
    finally:
        store.close()
