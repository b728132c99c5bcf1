"""``leaseq.signals``: stop signals wake the loop through a self-pipe; no lock in the handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from contextlib import AbstractContextManager

from leaseq.signals import StopSignals, stop_event


def test_a_stop_signal_wakes_the_waiter_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        # When SIGTERM arrives
        assert not stop.wait(0)
        os.kill(os.getpid(), signal.SIGTERM)
        # Then the wait returns at once, having counted it
        assert stop.wait(10)
        assert stop.received == 1
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_that_was_ignored_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def threads_that_set(stopping: AbstractContextManager[threading.Event]) -> list[str]:
    """Enter ``stopping``, send this process SIGTERM, and name the threads that set its event."""
    setters: list[str] = []
    with stopping as event:
        original_set = event.set

        def record_set() -> None:
            setters.append(threading.current_thread().name)
            original_set()

        event.set = record_set  # type: ignore[method-assign]
        os.kill(os.getpid(), signal.SIGTERM)
        assert event.wait(10)
    return setters


def test_stop_event_is_set_by_a_watcher_thread_not_by_the_handler() -> None:
    assert threads_that_set(stop_event()) == ["leaseq-stop-signals"]


def test_a_signal_landing_while_the_main_thread_holds_the_events_lock_does_not_deadlock(
) -> None:
    # Given a main thread inside the Event's own lock when SIGTERM lands (a handler that called
    # event.set() there would wait for that lock for ever)
    script = textwrap.dedent("""
        import os, signal, time
        from leaseq.signals import stop_event
        with stop_event() as event:
            with event._cond:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the Python-level handler runs here, inside the lock
            print("set" if event.wait(10) else "not set", flush=True)
    """)
    # When it runs
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    # Then the process finishes and the event was set
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set"


def test_the_rabbitmq_entry_points_stop_through_the_watcher_thread() -> None:
    # Given the event run_dispatcher / run_consumer stop on when the caller gives none
    from leaseq.delivery.rabbitmq import _stop_on_signals

    # When SIGTERM arrives, Then the watcher thread sets it, not the signal handler
    assert threads_that_set(_stop_on_signals(None)) == ["leaseq-stop-signals"]
    # And a caller's own event is used as given
    own = threading.Event()
    with _stop_on_signals(own) as event:
        assert event is own
