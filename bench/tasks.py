"""The benchmark's leaseq apps: one no-op task, run by ``leaseq worker bench.tasks:app``, and
the same task on a queue with a key limit (``bench.tasks:keyed_app``, the keyed drain).

The store comes from ``LEASEQ_URL`` (or the worker's ``--url``), so importing this module
opens nothing.
"""

from __future__ import annotations

from bench.systems import record_start
from leaseq.app import App

#: The queue every leaseq scenario uses.
QUEUE = "bench"
#: The task name the scenarios enqueue with.
TASK = "noop"

app = App()


@app.task(name=TASK, queue=QUEUE)
def noop(i: int) -> None:
    """Does nothing but note its start time when the latency scenario asks for it."""
    record_start(i)


#: The keyed drain: jobs spread over ``KEYS`` concurrency keys, ``KEY_LIMIT`` of a key at once.
KEYS, KEY_LIMIT = 10, 4
#: The wide keyed drain: as many keys as make ``KEY_LIMIT`` of each more than a worker holds
#: (400 slots against its 10 slots and prefetch of 128), so the limit never binds and what
#: the drain shows is the key-limited claim's own cost.
WIDE_KEYS = 100
#: How many priorities the priority drain spreads its jobs over.
PRIORITIES = 10

keyed_app = App(queues={QUEUE: {"key_limit": KEY_LIMIT}})


@keyed_app.task(name=TASK, queue=QUEUE)
def noop_keyed(i: int) -> None:
    record_start(i)

