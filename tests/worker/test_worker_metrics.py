"""Metrics scraped over HTTP and parsed, and the sweeper on its own."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from worker_helpers import running, wait_until

import leaseq
from leaseq import deadline, sweeper
from leaseq.browse import SUMMARY_STATUSES
from leaseq.errors import StoreUnavailable
from leaseq.metrics import STORE_READ_S, Metrics, ScheduleCollector, StoreCollector


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_worker_metrics_endpoint(app: leaseq.App) -> None:
    # Given jobs that finish, fail for good, and one that waits
    @app.task(queue="work")
    def ok(n: int) -> int:
        return n

    @app.task(queue="work")
    def bad() -> None:
        raise leaseq.Permanent("no")

    for n in range(3):
        ok.enqueue(n=n, job_id=f"ok{n}")
    bad.enqueue(job_id="bad")
    ok.enqueue(n=9, job_id="later", delay_s=3600)
    port = free_port()
    with running(app, metrics_port=port, metrics_addr="127.0.0.1"):
        wait_until(lambda: app.queue("work").counts().get("done") == 3)
        wait_until(lambda: app.queue("work").counts().get("failed") == 1)
        # When Prometheus scrapes the worker
        samples = scrape(port)
    # Then the counters and the store gauges are there, labelled by queue
    q = (("queue", "work"),)
    assert samples[("leaseq_processed_total", (("outcome", "done"), *q))] == 3
    assert samples[("leaseq_processed_total", (("outcome", "permanent"), *q))] == 1
    assert samples[("leaseq_job_duration_seconds_count", q)] == 4
    assert samples[("leaseq_jobs", (*q, ("status", "done")))] == 3
    assert samples[("leaseq_jobs", (*q, ("status", "pending")))] == 1
    assert samples[("leaseq_ready_jobs", q)] == 0  # the pending one is not due: not real work
    assert samples[("leaseq_oldest_pending_age_seconds", q)] == 0
    assert samples[("leaseq_in_flight_jobs", q)] == 0


def test_port_0_serves_on_the_port_the_system_gave_and_says_which() -> None:
    server = Metrics().serve(0, "127.0.0.1")
    try:
        # (the exporter's start-up line had announced ":0")
        assert server.port > 0
        assert scrape(server.port) is not None  # it answers there
    finally:
        server()


def test_sweep_counts_reclaimed_leases(app: leaseq.App) -> None:
    @app.task(queue="work")
    def ok() -> None: ...

    ok.enqueue(job_id="a")
    ok.enqueue(job_id="b", delay_s=0)
    q = app.queue("work")
    q.claim("dead-worker", 2, lease_s=1)
    app.store.time_offset_s = 5  # the store's clock moves past the leases
    from leaseq.worker import Worker, WorkerConfig

    worker = Worker(app, WorkerConfig())
    results = worker.sweep()
    assert [(r.queue, r.reclaimed, r.expired) for r in results] == [("work", 2, 0)]
    assert worker.metrics.registry.get_sample_value(
        "leaseq_reclaimed_total", {"queue": "work"}) == 2


def test_a_workers_retention_purges_only_the_queues_it_serves(app: leaseq.App) -> None:
    # Given a worker of queue "work" that keeps done jobs 60 s, and a done job in its queue and
    # in another app's queue "orders" of the same store, both older than that
    from leaseq.worker import Worker, WorkerConfig

    @app.task(queue="work")
    def ok() -> None: ...

    for name in ("work", "orders"):
        q = app.queue(name)
        q.enqueue("old", {})
        q.complete(q.claim("w", 1)[0])
        q.enqueue("lapsed", {})
        q.claim("dead-worker", 1, lease_s=1)
    app.store.time_offset_s = 120
    worker = Worker(app, WorkerConfig(retention_s={"done": 60}))
    # When it sweeps
    results = {r.queue: (r.reclaimed, r.purged) for r in worker.sweep()}
    # Then its own queue's done job is purged; the other queue's expired lease is reclaimed
    # (the sweep reclaims every queue) but its done job is kept: a purged id is forgotten, and
    # a replay of it would make a second job in an app that never chose this retention
    assert results == {"work": (1, 1), "orders": (1, 0)}
    assert app.queue("work").get("old") is None
    assert app.queue("orders").get("old") is not None


def two_lapsed_leases_and_a_failing_step(app: leaseq.App, monkeypatch: pytest.MonkeyPatch,
                                         step: str) -> None:
    """Queues "aa" and "zz" with a lease that ran out in each, and the store's ``step``
    (``reclaim_expired``, ``purge``) failing for "aa" as one cut at its deadline."""
    for name in ("aa", "zz"):
        q = app.queue(name)
        q.enqueue("j", {})
        assert q.claim("w", 1, lease_s=1)
    app.store.time_offset_s = 5
    real = getattr(app.store, step)

    def failing(queue: str, *args: object, **kwargs: object) -> object:
        if queue == "aa":
            raise StoreUnavailable(f"the {step} was cut at its deadline")
        return real(queue, *args, **kwargs)

    monkeypatch.setattr(app.store, step, failing)


def test_a_workers_sweep_counts_the_queues_swept_when_another_fails(
        app: leaseq.App, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given expired leases in two queues, and a reclaim of the first that fails
    from leaseq.worker import Worker, WorkerConfig

    two_lapsed_leases_and_a_failing_step(app, monkeypatch, "reclaim_expired")
    worker = Worker(app, WorkerConfig(queues=("aa", "zz")))
    # When the worker sweeps, Then the other queue's reclaim is returned and counted
    assert [(r.queue, r.reclaimed) for r in worker.sweep()] == [("zz", 1)]
    assert worker.metrics.registry.get_sample_value(
        "leaseq_reclaimed_total", {"queue": "zz"}) == 1


def test_store_gauges_are_cached_between_scrapes(app: leaseq.App) -> None:
    @app.task(queue="work")
    def ok() -> None: ...

    metrics = Metrics()
    metrics.watch_store(app.store, lambda: ["work"], refresh_s=3600)
    assert metrics.registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) == 0
    ok.enqueue(job_id="a")
    # Within refresh_s the gauges are not read again
    assert metrics.registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) == 0


def test_store_gauges_go_once_the_store_has_been_unreadable_too_long(app: leaseq.App) -> None:
    # Given store gauges read with 5 ready jobs, on a clock the test moves
    for n in range(5):
        app.queue("work").enqueue(f"r{n}", {})
    now = [0.0]
    collector = StoreCollector(app.store, lambda: ["work"], refresh_s=5, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)
    assert registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) == 5
    assert registry.get_sample_value("leaseq_store_up") == 1

    # When the store cannot be read any more
    def down(*args: object) -> None:
        raise StoreUnavailable("db down")

    app.store.queues = down  # type: ignore[method-assign]
    app.store.counts = down  # type: ignore[method-assign]
    now[0] = 6.0
    # Then a read that failed says so at once, and the last counts stand a while
    assert registry.get_sample_value("leaseq_store_up") == 0
    assert registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) == 5
    # And once they are three refreshes old (and at least 15 s) they are no longer served
    now[0] = 3600.0
    assert registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) is None
    assert registry.get_sample_value("leaseq_jobs", {"queue": "work", "status": "pending"}) \
        is None
    assert registry.get_sample_value("leaseq_store_up") == 0


def test_a_scrape_during_a_store_outage_answers_within_prometheuss_timeout(
        app: leaseq.App) -> None:
    # Given store gauges on a clock the test moves, and a store that does not answer: each
    # read waits until the caller's deadline (as a PostgreSQL read retries for reconnect_s)
    now = [0.0]
    collector = StoreCollector(app.store, lambda: ["work"], refresh_s=5, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(ScheduleCollector(app.store, refresh_s=5, clock=lambda: now[0]))
    waits: list[float | None] = []

    def unanswered(*args: object) -> None:
        waits.append(deadline.remaining_s())
        raise StoreUnavailable("gave up after the caller's deadline")

    app.store.limited_queues = unanswered  # type: ignore[method-assign]
    app.store.schedules = unanswered  # type: ignore[method-assign]

    def scrape() -> float:
        """A whole scrape (every collector); the value of leaseq_store_up."""
        samples = [s for family in registry.collect() for s in family.samples]
        return next(s.value for s in samples if s.name == "leaseq_store_up")

    # When it is scraped, and scraped again within refresh_s
    assert scrape() == 0
    now[0] = 1.0
    assert scrape() == 0
    # Then each read of the scrape waited a bounded time, together within Prometheus's 10 s,
    # and neither the gauges nor the ledger were read again before refresh_s (the second
    # scrape read nothing: a failed read is not retried on every scrape)
    assert len(waits) == 2 and all(w is not None and w <= STORE_READ_S for w in waits)
    assert 2 * STORE_READ_S < 10
    now[0] = 6.0
    assert scrape() == 0
    assert len(waits) == 4

def test_a_status_count_that_falls_to_zero_reads_zero(app: leaseq.App) -> None:
    # Given a queue with one failed job and one finished with an app's own status
    q = app.queue("work")
    q.enqueue("f", {})
    q.fail(q.claim_one("f", "w", lease_s=60), "boom")  # type: ignore[arg-type]
    q.enqueue("s", {})
    q.complete(q.claim_one("s", "w", lease_s=60), None, status="skipped")  # type: ignore[arg-type]
    metrics = Metrics()
    metrics.watch_store(app.store, lambda: ["work"], refresh_s=0)
    jobs = lambda status: metrics.registry.get_sample_value(  # noqa: E731
        "leaseq_jobs", {"queue": "work", "status": status})
    assert (jobs("failed"), jobs("pending"), jobs("skipped")) == (1, 0, 1)
    # When the failed job is deleted
    app.store.act_on_jobs("work", "delete", ["f"], "me")
    # Then its status reads 0: every status of leaseq's is there, whatever its count
    assert [jobs(s) for s in SUMMARY_STATUSES] == [0] * len(SUMMARY_STATUSES)
    assert jobs("skipped") == 1  # an app's own status is there while it has jobs


def test_in_flight_gauge_counts_running_work(app: leaseq.App) -> None:
    # Given a job held under a live lease, one whose lease ran out, and one ready
    @app.task(queue="work")
    def ok() -> None: ...

    for job_id in ("running", "expired", "ready"):
        ok.enqueue(job_id=job_id)
    q = app.queue("work")
    q.claim_one("running", "w", lease_s=600)
    q.claim_one("expired", "w", lease_s=1)
    app.store.time_offset_s = 5  # the store's clock moves past the short lease
    metrics = Metrics()
    metrics.watch_store(app.store, lambda: ["work"], refresh_s=0)
    # Then only the live lease is in flight; the expired one is ready work again
    assert metrics.registry.get_sample_value("leaseq_in_flight_jobs", {"queue": "work"}) == 1
    assert metrics.registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) == 2


def test_sweeper_reclaims_buries_and_purges(app: leaseq.App) -> None:
    # Given a spent job and a live one whose leases ran out, and an old done job
    @app.task(queue="work", max_attempts=1)
    def once() -> None: ...

    @app.task(queue="work")
    def twice() -> None: ...

    once.enqueue(job_id="spent")
    twice.enqueue(job_id="live")
    twice.enqueue(job_id="finished")
    q = app.queue("work")
    for job in q.claim("w", 3, lease_s=1):
        if job.id == "finished":
            q.complete(job)
    app.store.time_offset_s = 5  # the store's clock moves past the leases
    # When the sweeper runs with a retention for done jobs of 0 s
    results = sweeper.run_once(app.store, sweeper.SweeperConfig(retention_s={"done": 0}))
    # Then the spent one is quarantined as expired, the other is ready, the done one gone
    assert [(r.expired, r.reclaimed, r.purged) for r in results] == [(1, 1, 1)]
    assert q.get("spent").failure == "expired"  # type: ignore[union-attr]
    assert q.get("live").status == "pending"  # type: ignore[union-attr]
    assert q.get("finished") is None
    # And a second sweep finds nothing (idempotent)
    assert [(r.expired, r.reclaimed, r.purged) for r in sweeper.run_once(app.store)] == [(0, 0, 0)]


def test_a_queue_whose_sweep_fails_leaves_the_others_swept(
        app: leaseq.App, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two queues with a lease that ran out in each, and a purge of the first that fails
    # (cut at its deadline on a big table, say)
    two_lapsed_leases_and_a_failing_step(app, monkeypatch, "purge")
    # When a sweep runs, Then it raises the failure, but only once the other queue is swept
    with pytest.raises(StoreUnavailable, match="cut at its deadline"):
        sweeper.run_once(app.store, sweeper.SweeperConfig(retention_s={"done": 60}))
    assert app.queue("zz").get("j").status == "pending"  # type: ignore[union-attr]


@pytest.mark.parametrize("config", [{"every_s": 0}, {"retention_s": {"pending": 1}},
                                    {"retention_s": {"done": -1}}])
def test_sweeper_config_is_checked(config: dict) -> None:
    with pytest.raises(leaseq.InvalidInput):
        sweeper.SweeperConfig(**config)


@pytest.mark.parametrize("config", [{"concurrency": 0}, {"grace_s": -1}, {"idle_min_s": 0},
                                    {"idle_min_s": 2, "idle_max_s": 1}, {"colour": "red"},
                                    # NaN passes every "< 0" check: a NaN margin would keep
                                    # the lease clock from ever abandoning a job
                                    {"lease_margin_s": float("nan")},
                                    {"grace_s": float("nan")},
                                    {"prefetch_wait_s": float("nan")},
                                    {"claim_gather_s": float("inf")},
                                    {"grace_s": 10**400}], ids=repr)
def test_worker_config_is_checked(config: dict) -> None:
    from leaseq.worker import WorkerConfig

    with pytest.raises((leaseq.InvalidInput, TypeError)):
        WorkerConfig(**config)


def test_held_back_and_runnable_gauges_explain_ready_but_not_running(app: leaseq.App) -> None:
    # Given a queue limited to 2 claims a second and 1 job per key: 3 jobs of tenant a,
    # 1 of tenant b; one claim has run
    q = app.store.queue("limited", key_limit=1, rate_per_s=2)
    for i in range(3):
        q.enqueue(f"a{i}", {}, concurrency_key="a")
    q.enqueue("b0", {}, concurrency_key="b")
    q.enqueue("c0", {})
    assert len(q.claim("w", limit=1)) == 1  # a0: key a is full, one of 2 claims this second
    metrics = Metrics()
    metrics.watch_store(app.store, lambda: ["limited"], refresh_s=0)

    def gauge(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"queue": "limited", **labels})

    # Then of 4 ready jobs, a1 and a2 wait for their key, and b0 and c0 are what one second
    # of the rate takes (the one claim of this second does not count: an autoscaler would
    # see no work for most of every second): two jobs are runnable
    assert gauge("leaseq_ready_jobs") == 4
    assert gauge("leaseq_held_back_jobs", limit="key") == 2
    assert gauge("leaseq_held_back_jobs", limit="rate") == 0
    assert gauge("leaseq_runnable_jobs") == 2
