"""``leaseq.signals``: stop signals wake the loop through a self-pipe, or (the worker) are
counted by a handler that exits on the second; no lock in either handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import FrameType, SimpleNamespace
from typing import Any

import pytest

from leaseq import signals
from leaseq.signals import (
    EXIT_SECOND_SIGNAL,
    SECOND_SIGNAL_MESSAGE,
    DrainThenExit,
    StopSignals,
    stop_event,
)


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


# --- the worker's handler: a first signal drains, a second exits -------------------------


class FakeOs:
    """Stands in for ``os`` inside ``leaseq.signals``: records the stderr line and the exit."""

    def __init__(self) -> None:
        self.written: list[tuple[int, bytes]] = []
        self.exited: list[int] = []

    def write(self, fd: int, data: bytes) -> int:
        self.written.append((fd, data))
        return len(data)

    def _exit(self, status: int) -> None:
        self.exited.append(status)


def calls_while(send: Callable[[], None]) -> list[str]:
    """The names of the Python functions and builtins this thread called while ``send`` ran
    (the signal's handler runs inside it: the signal is sent to this process by this thread)."""
    names: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            names.append(frame.f_code.co_name)
        elif event == "c_call":
            names.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(profile)
    try:
        send()
    finally:
        sys.setprofile(None)
    return names


def test_a_first_stop_signal_is_counted_and_a_second_exits_without_taking_a_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the worker's handler installed, with the process's exit recorded instead of taken
    fake = FakeOs()
    monkeypatch.setattr(signals, "os", fake)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with DrainThenExit() as stops:
        # When a first SIGTERM arrives
        first = calls_while(lambda: os.kill(os.getpid(), signal.SIGTERM))
        # Then it is counted for the loop to see, and nothing else happens
        assert stops.received == 1 and fake.exited == [] and fake.written == []
        # When a second one (SIGINT) arrives
        second = calls_while(lambda: os.kill(os.getpid(), signal.SIGINT))
        # Then the process is told to exit at once with 130, saying why on stderr
        assert fake.exited == [EXIT_SECOND_SIGNAL] == [130]
        assert fake.written == [(2, SECOND_SIGNAL_MESSAGE)]
    # And neither handler took a lock or set an Event (it may run inside a lock the main
    # thread holds)
    assert "_on_signal" in first and "_on_signal" in second
    locking = {"acquire", "release", "__enter__", "__exit__", "set", "wait", "notify",
               "notify_all", "put", "emit", "handle"}
    assert not locking & {*first, *second}, (first, second)
    # And the previous handlers are back
    assert {s: signal.getsignal(s) for s in before} == before



def test_a_stop_signal_soon_after_the_first_is_the_same_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the handler of a supervised child, for which a signal within 2 s of the first is
    # the same stop, on a clock the test moves (and the exit recorded instead of taken)
    fake = FakeOs()
    monkeypatch.setattr(signals, "os", fake)
    now = [100.0]
    monkeypatch.setattr(signals, "time", SimpleNamespace(monotonic=lambda: now[0]))
    with DrainThenExit(same_stop_s=2.0) as stops:
        # When the stop reaches it twice in a moment (its process group's, then the one its
        # parent forwards)
        os.kill(os.getpid(), signal.SIGTERM)
        now[0] += 0.5
        os.kill(os.getpid(), signal.SIGTERM)
        # Then that is one stop: it drains
        assert stops.received == 1 and fake.exited == []
        # When another comes later
        now[0] += 2.0
        os.kill(os.getpid(), signal.SIGTERM)
        # Then that one is the second stop, which exits at once
        assert fake.exited == [EXIT_SECOND_SIGNAL]

def test_the_worker_handler_keeps_an_ignored_signal_ignored() -> None:
    # Given SIGINT ignored (a supervised child, a job started in the background)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # When the worker's handler is installed, Then SIGINT stays ignored and SIGTERM is ours
        with DrainThenExit():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_worker_handler_installs_nothing_outside_the_main_thread() -> None:
    # Given the worker's handler entered in a thread that is not the main one
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def enter() -> None:
        with DrainThenExit():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    # Then the main thread's handler was left as it was
    assert seen == [before] and signal.getsignal(signal.SIGTERM) is before


def test_a_second_stop_signal_ends_a_real_process_with_130() -> None:
    # Given a process with the worker's handler whose main thread blocks for ever on a lock it
    # holds itself (a drain that cannot end), and a thread that signals the main thread twice
    script = textwrap.dedent("""
        import signal, threading
        from leaseq.signals import DrainThenExit

        def signal_twice(main):
            signal.pthread_kill(main, signal.SIGTERM)
            signal.pthread_kill(main, signal.SIGINT)

        lock = threading.Lock()
        with DrainThenExit(), lock:
            threading.Thread(target=signal_twice, args=(threading.get_ident(),)).start()
            lock.acquire()  # never returns: only the handler can end the process
    """)
    # When it runs, Then the second signal ended it at once, with the message on stderr
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == EXIT_SECOND_SIGNAL, done.stderr
    assert done.stderr == SECOND_SIGNAL_MESSAGE.decode()


# --- stop_event: the first signal asks, the second ends the process ----------------------


def run_stop_event_script(signals_sent: int) -> subprocess.CompletedProcess[str]:
    """A process inside ``stop_event`` whose main thread is stuck (a sweep's long purge, a
    database that does not answer: it never looks at the event) until it is given the event's
    word; a thread sends it ``signals_sent`` stop signals, the second once the first has set
    the event, then lets the main thread finish."""
    script = textwrap.dedent(f"""
        import os, signal, threading
        from leaseq.signals import stop_event

        def signal_then_release(main, event, stuck):
            signal.pthread_kill(main, signal.SIGTERM)
            assert event.wait(30)
            if {signals_sent} > 1:
                signal.pthread_kill(main, signal.SIGINT)
                threading.Event().wait(30)  # the second signal ends the process first
            stuck.release()

        stuck = threading.Lock()
        stuck.acquire()
        with stop_event() as event:
            threading.Thread(target=signal_then_release,
                             args=(threading.get_ident(), event, stuck), daemon=True).start()
            stuck.acquire()
        print("finished", flush=True)
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)


def test_a_second_stop_signal_ends_a_stop_event_process_stuck_in_its_work() -> None:
    # When a process stuck in its work gets a second stop signal after the first
    done = run_stop_event_script(signals_sent=2)
    # Then it ends at once with 130 and the message, without finishing its work
    assert done.returncode == EXIT_SECOND_SIGNAL, done.stderr
    assert done.stderr == SECOND_SIGNAL_MESSAGE.decode()
    assert done.stdout == ""


def test_one_stop_signal_lets_a_stop_event_process_finish_its_work() -> None:
    # When it gets only one
    done = run_stop_event_script(signals_sent=1)
    # Then it finishes what it was doing and exits cleanly
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finished\n"
