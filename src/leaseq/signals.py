"""Stop signals (SIGTERM, SIGINT) for leaseq's long-running commands, without the handler hazard.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds the very lock that ``threading.Event.set``, a queue or a logging handler would take:
a handler that takes a lock can deadlock the process it is meant to stop. So the handler
installed here does nothing at all. The message is the byte that the interpreter's C-level
handler writes to a self-pipe (``signal.set_wakeup_fd``): a loop reads it through
``StopSignals.wait`` or waits on ``fileno()`` beside its own file descriptors, and code that
takes a ``threading.Event`` gets one from ``stop_event``, set by a watcher thread, an ordinary
thread where taking a lock is safe.

The worker's main loop stops differently (``DrainThenExit``): its handler only adds one to a
counter the loop polls, and on the second signal writes a line to stderr and ends the process.
Neither takes a lock, and the second signal must end a process whose main thread may be stuck
(in a drain, or in a handler that ignores its grace period), so no thread may be needed to act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
#: Exit status after a second stop signal: in-flight jobs are left to their leases.
EXIT_SECOND_SIGNAL = 130
SECOND_SIGNAL_MESSAGE = (b"leaseq: second stop signal, exiting now; in-flight jobs come back "
                         b"when their leases expire\n")
_WAKE = b"\0"  # not a signal number: written by ``interrupt`` to free a waiting thread


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: the C-level handler has already written the wake-up byte."""


class StopSignals:
    """While entered, SIGTERM / SIGINT (or ``signals``) stop nothing by themselves: they are
    counted, and ``wait`` returns. A signal that was ignored when entered (a supervised child,
    a job started in the background) stays ignored. Outside the main thread nothing is
    installed (Python delivers signals to the main thread only) and ``wait`` just waits."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS):
        self.signals = frozenset(int(s) for s in signals)
        self.received = 0
        """Stop signals read from the pipe so far."""
        self._read = self._write = -1
        self._previous: dict[int, Any] = {}
        self._previous_fd: int | None = None
        self._closing = False

    def __enter__(self) -> StopSignals:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        if threading.current_thread() is threading.main_thread():
            self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            for sig in self.signals:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, _ignore)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: a handler installed from C, which we cannot restore
                signal.signal(sig, handler)
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
        self.interrupt()
        # Closed last, once no thread reads them: a number closed too early could be reused by
        # another file, which a late ``take`` would then read from.
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def fileno(self) -> int:
        """Readable once a signal arrived: wait on it beside other file descriptors, then call
        ``take``."""
        return self._read

    @property
    def requested(self) -> bool:
        return self.received > 0

    def take(self) -> int:
        """Read what the pipe holds without blocking; the number of new stop signals."""
        new = 0
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._read, 512):
                new += sum(1 for byte in data if byte in self.signals)
        self.received += new
        return new

    def wait(self, timeout_s: float | None = None, count: int = 1) -> bool:
        """Block until ``count`` stop signals have arrived in all (or ``timeout_s`` passes, or
        ``interrupt``); True once they have."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.received < count and not self._closing:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            select.select([self._read], [], [], remaining)
            self.take()
        return self.received >= count

    def interrupt(self) -> None:
        """Free a thread blocked in ``wait`` (it returns ``requested``, False without a
        signal)."""
        self._closing = True
        with contextlib.suppress(OSError):
            os.write(self._write, _WAKE)


@contextlib.contextmanager
def stop_event(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[threading.Event]:
    """An ``Event`` that a stop signal sets, for code that stops on an Event (the sweeper
    loop, the dispatcher, the consumer, the scheduler). A watcher thread sets it, never the
    handler. A second stop signal ends the process at once, as the worker's does
    (``SECOND_SIGNAL_MESSAGE`` on stderr, ``EXIT_SECOND_SIGNAL``): the first asks the loop to
    finish what it is doing, which may be long (a purge, a database that does not answer),
    and the one who sent it may not want to wait."""
    event = threading.Event()
    with StopSignals(signals) as stop:
        watcher = threading.Thread(target=_set_when_signalled, args=(stop, event),
                                   name="leaseq-stop-signals", daemon=True)
        watcher.start()
        try:
            yield event
        finally:
            stop.interrupt()
            watcher.join()


def _set_when_signalled(stop: StopSignals, event: threading.Event) -> None:
    if not stop.wait():
        return
    log.info("stop signal received; stopping (a second one exits at once)")
    event.set()
    if stop.wait(count=2):
        os.write(2, SECOND_SIGNAL_MESSAGE)
        os._exit(EXIT_SECOND_SIGNAL)


class DrainThenExit:
    """While installed (``install`` / ``restore``, or ``with``), SIGTERM / SIGINT (or
    ``signals``) are counted in ``received``, which the worker's loop polls to begin its drain;
    the second one writes ``SECOND_SIGNAL_MESSAGE`` to stderr and ends the process at once with
    ``EXIT_SECOND_SIGNAL``. A signal ignored when installed stays ignored; outside the main
    thread nothing is installed (and ``received`` stays 0).

    ``same_stop_s``: a signal that comes this soon after the first is the same stop, sent
    twice, and is not counted. A supervised child (``leaseq worker --processes``) gets the
    stop of a whole process group or cgroup (systemd's default ``KillMode``, ``kill -TERM
    -PGID``, ``tini -g``) and then its parent's forwarded one, at once: counted, the second
    would end the child without its grace period."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS, same_stop_s: float = 0.0):
        self.signals = tuple(signals)
        self.same_stop_s = same_stop_s
        self.received = 0
        """Stop signals received so far: written by the handler, read by the loop."""
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers ``install`` replaced."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler installed from C, which we cannot restore
                signal.signal(sig, handler)

    def __enter__(self) -> DrainThenExit:
        self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # It runs on the main thread between two bytecodes, maybe inside a lock that thread
        # holds: an int attribute, the clock and a raw write to fd 2 take none (print and
        # logging would).
        now = time.monotonic()
        if self.received and now - self._first_at < self.same_stop_s:
            return
        if not self.received:
            self._first_at = now
        self.received += 1
        if self.received > 1:
            os.write(2, SECOND_SIGNAL_MESSAGE)
            os._exit(EXIT_SECOND_SIGNAL)
