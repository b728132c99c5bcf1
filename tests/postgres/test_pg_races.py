"""PostgreSQL-specific: concurrent enqueues of the same new ids. (Store-specific because the
race is in this store's own mechanism: INSERT … ON CONFLICT DO NOTHING, then decide again
under the winner's row lock, all under a savepoint.)"""

from __future__ import annotations

import threading
from collections import Counter

from leaseq.stores.postgres import PostgresStore

THREADS = 8
IDS = 200


def test_racing_enqueues_of_the_same_ids_create_each_job_once(store: PostgresStore) -> None:
    # Given eight producers that enqueue the same 200 new ids at the same moment, each in
    # its own order (so their row locks interleave)
    q = store.queue("race")
    start = threading.Barrier(THREADS)
    outcomes: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        ids = [f"job-{(i * (n + 1)) % IDS:04d}" for i in range(IDS)]
        specs = [q.spec(job_id, {"same": True}) for job_id in dict.fromkeys(ids)]
        start.wait()
        try:
            results = q.enqueue_many(specs)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            outcomes.update(r.outcome.value for r in results)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Then nobody failed, every id was created exactly once and replayed by the others
    assert errors == []
    assert outcomes["created"] == IDS
    assert set(outcomes) <= {"created", "unchanged"}
    assert q.counts() == {"pending": IDS}
    assert all(len(q.journal(f"job-{i:04d}")) == 1 for i in range(0, IDS, 17))
