"""The PostgreSQL store's call watchdog, on sockets of its own: a call past its deadline is cut,
and a stream of calls with the usual deadline never wakes the watchdog's thread."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from leaseq.stores.postgres.watchdog import Watchdog

HORIZON_S = 30.0


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    dog = Watchdog("test-watchdog", horizon_s=HORIZON_S)
    yield dog
    dog.close()


def _settled(dog: Watchdog) -> None:
    """Until the thread sleeps towards a deadline (it has taken the first call's wake-up)."""
    give_up = time.monotonic() + 5
    while dog._wakes_at == float("inf"):
        assert time.monotonic() < give_up, "the watchdog's thread never went to sleep"
        time.sleep(0.001)


@pytest.fixture
def call(watchdog: Watchdog) -> Iterator[socket.socket]:
    """One end of a socket pair, watched once already, with the watchdog's thread asleep."""
    left, right = socket.socketpair()
    with left, right:
        with watchdog.guard(left, time.monotonic() + HORIZON_S):
            pass
        _settled(watchdog)
        yield left


def test_calls_with_the_usual_deadline_never_wake_the_thread(
        watchdog: Watchdog, call: socket.socket) -> None:
    woken = watchdog.wakes
    for _ in range(1000):
        with watchdog.guard(call, time.monotonic() + HORIZON_S):
            pass
    assert watchdog.wakes == woken
    assert watchdog.cuts == 0


def test_a_shorter_deadline_wakes_it_and_the_call_is_cut(
        watchdog: Watchdog, call: socket.socket) -> None:
    woken = watchdog.wakes
    started = time.monotonic()
    with watchdog.guard(call, started + 0.05):
        # A call that never gets an answer: the read returns only once the socket is cut.
        assert call.recv(1) == b""
    assert watchdog.wakes == woken + 1
    assert watchdog.cuts == 1
    assert time.monotonic() - started < HORIZON_S / 2
