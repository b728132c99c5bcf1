"""Options shared by every test folder."""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import settings

# The conformance suites' and the chaos scenarios' asserts live in the library: rewrite them so
# a failure shows its values. Here, before any test folder imports them (registered later,
# pytest can only warn that the module was imported already).
pytest.register_assert_rewrite("leaseq.testing")

# Property tests have no time limit per example: a loaded CI machine (a checkpoint, the other
# core busy) can hold one past Hypothesis's 200 ms default, and a test that fails for that is
# a flaky test. A test that sets its own deadline keeps it.
settings.register_profile("leaseq", deadline=None)
settings.load_profile("leaseq")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (or set LEASEQ_SLOW=1)")


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a non-interactive shell (`scripts/test &`) inherits
    # SIGINT ignored, and so would every process a test starts: leaseq keeps an ignored
    # signal ignored (as nohup expects), so the tests that send one would time out. A handler
    # (unlike an ignore) is reset at exec, so the processes the tests start see a default
    # SIGINT, as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow") or os.environ.get("LEASEQ_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow test: run with --slow or LEASEQ_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
