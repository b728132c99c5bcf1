"""The processes the RabbitMQ tests start: a consumer or a dispatcher over one store.

    python procs.py consume --url STORE_URL --amqp-url URL [--concurrency N]
    python procs.py dispatch --url STORE_URL --amqp-url URL

Crash points are deterministic, set by environment variables (never sleep-and-hope):

* ``LEASEQ_TEST_KILL_AFTER_RESULT=JOB_ID``: the consumer SIGKILLs itself right after that job's
  outcome is durable and before its ack is handed to the connection's thread;
* ``LEASEQ_TEST_KILL_BEFORE_MARK=1``: the dispatcher SIGKILLs itself after RabbitMQ confirmed a
  batch and before ``mark_published`` writes anything.

A store outage is a file: with ``LEASEQ_TEST_STORE_DOWN=PATH`` every store call of the process
raises ``StoreUnavailable`` while PATH exists (the test creates and removes it).

Every effect a task makes is one line ``job_id attempt pid`` appended to
``$LEASEQ_TEST_EFFECTS`` (O_APPEND: lines from several processes never interleave), so the
tests count duplicate effects instead of assuming there are none.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

import leaseq
from leaseq import Job, Permanent, Retry
from leaseq.app import App
from leaseq.delivery.execute import app_executor
from leaseq.delivery.rabbitmq import (
    ConsumerConfig,
    DispatcherConfig,
    Topology,
    run_consumer,
    run_dispatcher,
)
from leaseq.errors import StoreUnavailable

QUEUE = "jobs"

app = App()


@app.task(queue=QUEUE, max_attempts=3)
def work(n: int, job: Job, sleep_s: float = 0.0, fail_times: int = 0,
         retry_delay_s: float = 1.0, poison: bool = False) -> dict:
    if poison:
        raise Permanent("poison input: this record can never be processed")
    if job.attempts <= fail_times:
        raise Retry("dependency unavailable", delay_s=retry_delay_s)
    if sleep_s:
        time.sleep(sleep_s)
    effect(job)
    return {"n": n}


def effect(job: Job) -> None:
    line = f"{job.id} {job.attempts} {os.getpid()}\n".encode()
    fd = os.open(os.environ["LEASEQ_TEST_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def kill_after_result(execute):
    target = os.environ.get("LEASEQ_TEST_KILL_AFTER_RESULT")

    def run(job: Job) -> Job:
        after = execute(job)
        if job.id == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return after

    return run if target else execute


class KillBeforeMark:
    """A store proxy whose ``mark_published`` dies before it writes."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def mark_published(self, queue, leases, as_of=None):
        os.kill(os.getpid(), signal.SIGKILL)


class DownWhileFlagged:
    """A store proxy that is down (every call raises ``StoreUnavailable``) while ``flag``
    exists, as a database is during an outage."""

    def __init__(self, store, flag: str):
        self._store = store
        self._flag = flag

    def __getattr__(self, name):
        value = getattr(self._store, name)
        if not callable(value) or name == "close":
            return value

        def call(*args, **kwargs):
            if os.path.exists(self._flag):
                raise StoreUnavailable("the test's store outage")
            return value(*args, **kwargs)

        return call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["consume", "dispatch"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--amqp-url", required=True)
    parser.add_argument("--prefix", default="leaseq")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delivery-limit", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.role}[{os.getpid()}] %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    store = leaseq.connect(args.url)
    if os.environ.get("LEASEQ_TEST_STORE_DOWN"):
        store = DownWhileFlagged(store, os.environ["LEASEQ_TEST_STORE_DOWN"])
    app.use_store(store)
    topology = Topology(prefix=args.prefix, delivery_limit=args.delivery_limit)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.role == "consume":
        run_consumer([app.queue(QUEUE)], kill_after_result(app_executor(app)), args.amqp_url,
                     stop=stop, topology=topology,
                     config=ConsumerConfig(concurrency=args.concurrency, grace_s=5,
                                           max_backoff_s=1.0))
    else:
        if os.environ.get("LEASEQ_TEST_KILL_BEFORE_MARK"):
            store = KillBeforeMark(store)
        queue = leaseq.Queue(store, QUEUE, app.policy(QUEUE))
        run_dispatcher([queue], args.amqp_url, stop=stop, topology=topology,
                       config=DispatcherConfig(poll_interval_s=0.2, reclaim_every_s=1.0,
                                               retry_publish_s=0.5, max_backoff_s=1.0))


if __name__ == "__main__":
    main()
