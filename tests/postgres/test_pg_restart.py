"""PostgreSQL-specific: workers ride out a server restart and no job is lost.

Runs against a throwaway cluster the test starts itself (never the shared server), restarted
with ``pg_ctl restart -m fast`` while worker threads claim and complete jobs.
"""

from __future__ import annotations

import threading
import time

from leaseq.errors import StoreUnavailable
from leaseq.job import LeaseLost
from leaseq.stores.postgres import PostgresStore

JOBS = 400
WORKERS = 4
#: Short, so a job whose completion was cut off by the restart is claimed again quickly.
LEASE_S = 2.0
WORK_S = 0.02


class Workers:
    """Threads that claim and complete jobs until every job is done (or time is up)."""

    def __init__(self, store: PostgresStore, deadline_s: float):
        self.q = store.queue("work")
        self.deadline = time.monotonic() + deadline_s
        self.completed = 0
        self.lock = threading.Lock()
        self.tolerated: list[str] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(f"w{i}",), daemon=True)
                        for i in range(WORKERS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(max(self.deadline - time.monotonic(), 0) + 5)

    def _run(self, name: str) -> None:
        while time.monotonic() < self.deadline:
            try:
                if not self._round(name):
                    return
            except (StoreUnavailable, LeaseLost) as exc:  # the restart's cut-off writes
                self.tolerated.append(f"{type(exc).__name__}: {exc}")
            except BaseException as exc:
                self.errors.append(exc)
                return

    def _round(self, name: str) -> bool:
        jobs = self.q.claim(name, limit=5, lease_s=LEASE_S)
        if not jobs:
            if self.q.counts().get("done", 0) == JOBS:
                return False
            self.q.store.wait_for_work(["work"], 0.2)
            return True
        for job in jobs:
            time.sleep(WORK_S)  # the handler's work
            self.q.complete(job, {"by": name})
            with self.lock:
                self.completed += 1
        return True


def test_workers_keep_going_across_a_restart_and_lose_no_job(cluster) -> None:  # type: ignore[no-untyped-def]
    # Given 400 jobs and four worker threads on a server we may restart
    store = PostgresStore.from_url(f"{cluster.url}?schema=restart&reconnect_s=30")
    try:
        store.queue("work").enqueue_many(
            [{"job_id": f"job-{i:04d}", "payload": {"n": i}} for i in range(JOBS)])
        workers = Workers(store, deadline_s=90)
        workers.start()
        _until(lambda: workers.completed >= JOBS // 4, 30, "a quarter of the jobs done")
        # When the server restarts under them
        cluster.restart()
        after_restart = workers.completed
        workers.join()
        # Then they kept going, and every job is done exactly once in the record
        assert workers.errors == []
        assert workers.completed > after_restart
        assert store.queue("work").counts() == {"done": JOBS}
    finally:
        store.close()


def _until(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
