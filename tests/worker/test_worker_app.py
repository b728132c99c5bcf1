"""App and tasks: registration, typed enqueue, payload checks, transactional enqueue."""

from __future__ import annotations

import sqlite3

import pytest

import leaseq
from leaseq.app import PayloadMismatch


def test_enqueue_by_keyword_is_idempotent_by_job_id(app: leaseq.App) -> None:
    # Given a task
    @app.task(queue="work")
    def make_thumbnail(path: str, width: int = 256) -> dict:
        return {"path": path}

    # When the same job is enqueued twice
    first = make_thumbnail.enqueue(path="a.png", job_id="file:1")
    again = make_thumbnail.enqueue(path="a.png", job_id="file:1")

    # Then one job exists, with the task's name and the payload as given
    assert (first.outcome, again.outcome) == (leaseq.EnqueueOutcome.CREATED,
                                              leaseq.EnqueueOutcome.UNCHANGED)
    job = app.queue("work").get("file:1")
    assert job is not None and job.task == "make_thumbnail" and job.payload == {"path": "a.png"}


def test_positional_arguments_become_named_payload(app: leaseq.App) -> None:
    @app.task(queue="work")
    def add(a: int, b: int) -> int:
        return a + b

    add.enqueue(1, b=2, job_id="sum")
    assert app.queue("work").get("sum").payload == {"a": 1, "b": 2}  # type: ignore[union-attr]
    assert add(1, 2) == 3  # still callable in-process


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "missing argument(s) path"),
        ({"path": "a", "colour": "red"}, "unknown argument(s) colour"),
        ({"path": 3}, "argument 'path' should be str, got int"),
        ({"path": "a", "width": True}, "argument 'width' should be int, got bool"),
        ({"path": "a", "width": "wide"}, "argument 'width' should be int"),
    ],
)
def test_payload_that_does_not_fit_is_refused_and_nothing_written(
    app: leaseq.App, kwargs: dict, message: str
) -> None:
    @app.task(queue="work")
    def make_thumbnail(path: str, width: int = 256, scale: float | None = None) -> None: ...

    with pytest.raises(PayloadMismatch, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_thumbnail.enqueue(job_id="x", **kwargs)
    assert isinstance(PayloadMismatch("x"), leaseq.InvalidPayload)
    assert app.queue("work").get("x") is None


def test_loose_types_are_accepted(app: leaseq.App) -> None:
    # An int where a float is declared, None for an optional, anything for an unchecked type.
    @app.task(queue="work")
    def scale(factor: float, limit: int | None, extra: object, tags: list[str]) -> None: ...

    scale.enqueue(factor=2, limit=None, extra={"k": 1}, tags=["a"], job_id="ok")
    assert app.queue("work").get("ok") is not None


def test_job_parameter_is_not_part_of_the_payload(app: leaseq.App) -> None:
    @app.task(queue="work")
    def charge(amount: int, job: leaseq.Job) -> str:
        return job.effect_key("charge")

    charge.enqueue(amount=5, job_id="c")
    with pytest.raises(PayloadMismatch):
        charge.enqueue(amount=5, job="x", job_id="d")


def test_kwargs_task_takes_any_named_argument(app: leaseq.App) -> None:
    @app.task(queue="work")
    def anything(**fields: object) -> None: ...

    anything.enqueue(a=1, b="two", job_id="k")
    assert app.queue("work").get("k").payload == {"a": 1, "b": "two"}  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["def f(id: str): ...", "def f(job_id: str): ...",
                                 "def f(a, /): ...", "def f(*args): ..."])
def test_parameters_a_payload_cannot_carry_are_refused_at_registration(
    app: leaseq.App, bad: str
) -> None:
    namespace: dict = {}
    exec(bad, namespace)
    with pytest.raises(leaseq.InvalidInput):
        app.task(namespace["f"])


def test_registration_errors(app: leaseq.App) -> None:
    def f() -> None: ...

    app.task(f)
    with pytest.raises(leaseq.InvalidInput, match="already registered"):
        app.task(f)
    with pytest.raises(leaseq.InvalidInput, match="unknown task option"):
        app.task(name="g", lease=5)(f)
    with pytest.raises(leaseq.InvalidInput, match="exception classes"):
        app.task(name="h", permanent=("ValueError",))(f)  # type: ignore[arg-type]
    with pytest.raises(leaseq.InvalidPolicy):
        app.task(name="i", lease_s=-1)(f)
    # a name no store can hold (every enqueue of the task failed later)
    for bad in ("bad\x00name", "bad\udcffname"):
        with pytest.raises(leaseq.InvalidInput, match="task name"):
            app.task(name=bad)(f)
    # one exception class is taken as a tuple of one
    assert app.task(name="j", permanent=ValueError)(f).permanent == (ValueError,)


def test_task_policy_overrides_the_queue(app: leaseq.App) -> None:
    @app.task(queue="work", max_attempts=2, lease_s=60)
    def slow() -> None: ...

    slow.enqueue(job_id="s")
    job = app.queue("work").get("s")
    assert job is not None and job.max_attempts == 2
    assert slow.policy.lease_s == 60 and slow.policy.heartbeat_every_s == 20
    assert slow.policy.backoff_base_s == 0.0  # the rest comes from the queue


def test_enqueue_many_keeps_order_across_queues(app: leaseq.App) -> None:
    @app.task(queue="a")
    def one(n: int) -> None: ...

    @app.task(queue="b")
    def two(n: int) -> None: ...

    results = app.enqueue_many([one.spec(n=1, job_id="1"), two.spec(n=2, job_id="2"),
                                one.spec(n=3, job_id="3")])
    assert [r.job_id for r in results] == ["1", "2", "3"]
    assert app.queue_names() == ["a", "b"]


def test_enqueue_many_across_queues_says_which_queues_a_conflict_left_enqueued(
        app: leaseq.App) -> None:
    # Given a job "2" of queue b already stored with another payload
    @app.task(queue="a")
    def one(n: int) -> None: ...

    @app.task(queue="b")
    def two(n: int) -> None: ...

    two.enqueue(n=0, job_id="2")
    # When a batch over queues a and b enqueues it again with n=2
    with pytest.raises(leaseq.JobConflict) as raised:
        app.enqueue_many([one.spec(n=1, job_id="1"), two.spec(n=2, job_id="2")])
    # Then queue a's job was enqueued (a transaction per queue), and the error says so: its
    # message speaks of queue b's batch only, its note names queue a
    assert app.queue("a").get("1") is not None
    assert "nothing of this batch was written" in str(raised.value)
    assert raised.value.__notes__ == [
        "the jobs of queue(s) 'a' were enqueued before queue 'b' failed (one transaction per "
        "queue); calling again with the same specs is safe"]


def test_enqueue_by_name(app: leaseq.App) -> None:
    @app.task(queue="work")
    def ping(n: int) -> None: ...

    app.enqueue("ping", {"n": 1}, job_id="p")
    with pytest.raises(leaseq.InvalidInput, match="no task named"):
        app.enqueue("pong", {}, job_id="q")
    with pytest.raises(PayloadMismatch):
        app.enqueue("ping", {"m": 1}, job_id="r")
    # a payload that is no JSON object, or has a key that is no string, is the payload's
    # error (bare TypeError and ValueError before), and nothing is written
    for payload in ("n=1", 7, {"n": 1, 2: "x"}):
        with pytest.raises(leaseq.InvalidPayload):
            app.enqueue("ping", payload, job_id="s")  # type: ignore[arg-type]
    assert app.queue("work").get("s") is None


def test_enqueue_in_the_callers_transaction(app: leaseq.App, url: str) -> None:
    # Given a task and the caller's own connection to the same database
    @app.task(queue="work")
    def ship(order: str) -> None: ...

    app.queue("work")  # the schema exists
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        # When the caller rolls back, the job is gone with the rest of its transaction
        conn.execute("BEGIN IMMEDIATE")
        ship.enqueue(order="o-1", job_id="o-1", connection=conn)
        conn.execute("ROLLBACK")
        assert app.queue("work").get("o-1") is None
        # When the caller commits, it is there
        conn.execute("BEGIN IMMEDIATE")
        ship.enqueue(order="o-1", job_id="o-1", connection=conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert app.queue("work").get("o-1") is not None


def test_store_opens_on_first_use_not_at_construction(tmp_path) -> None:
    app = leaseq.App(f"sqlite:///{tmp_path / 'missing' / 'jobs.db'}")

    @app.task
    def noop() -> None: ...

    # Defining the app and its tasks touches no database...
    assert not (tmp_path / "missing").exists()
    # ...using it does, and says so clearly
    with pytest.raises(leaseq.StoreUnavailable):
        noop.enqueue(job_id="n")
