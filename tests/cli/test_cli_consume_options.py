"""``leaseq rabbitmq consume`` is ``leaseq worker --delivery rabbitmq``: the same options, the
same bounds, the same start-up warning about the app's schedules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

Invoke = Callable[..., Result]
HERE = Path(__file__).parent
AMQP = ("--amqp-url", "amqp://b")
CONSUMERS = [("rabbitmq", "consume", "cli_periodic:app", *AMQP),
             ("worker", "cli_periodic:app", "--delivery", "rabbitmq", *AMQP)]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The consumers the commands would run: their options, no broker needed."""
    monkeypatch.syspath_prepend(str(HERE))
    from leaseq.delivery import rabbitmq

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(rabbitmq, "run_app_consumer",
                        lambda app, amqp_url, **kwargs: calls.append(kwargs))
    return calls


@pytest.mark.parametrize("args", CONSUMERS, ids=lambda a: " ".join(a[:2]))
def test_both_consumers_warn_of_the_schedules_unless_told_not_to(
        invoke: Invoke, started: list[dict[str, Any]], caplog: pytest.LogCaptureFixture,
        args: tuple[str, ...]) -> None:
    # Given an app with schedules, When a broker consumer of it starts
    assert invoke(*args).exit_code == 0
    # Then it says the schedules tick only where a scheduler runs
    assert "runs no scheduler" in caplog.text and "leaseq scheduler" in caplog.text
    # And --no-scheduler silences it, on either command
    caplog.clear()
    result = invoke(*args, "--no-scheduler")
    assert result.exit_code == 0, result.output
    assert "runs no scheduler" not in caplog.text


@pytest.mark.parametrize("args", CONSUMERS, ids=lambda a: " ".join(a[:2]))
def test_both_consumers_take_the_same_concurrency(
        invoke: Invoke, started: list[dict[str, Any]], args: tuple[str, ...]) -> None:
    # When either command is given the polling worker's largest --concurrency, and one past it
    ok = invoke(*args, "--concurrency", "10000", "--grace-s", "5")
    too_many = invoke(*args, "--concurrency", "10001")
    # Then both take the first and refuse the second as usage errors
    assert ok.exit_code == 0, ok.output
    assert started == [{**started[0], "concurrency": 10000, "grace_s": 5.0}]
    assert too_many.exit_code == 2 and "10001" in too_many.output
