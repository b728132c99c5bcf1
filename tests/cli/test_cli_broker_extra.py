"""Without the ``rabbitmq`` extra (pika not importable), every broker command says which extra
to install in one line and exits 1, before it opens or creates any store."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

Invoke = Callable[..., Result]

AMQP = ("--amqp-url", "amqp://guest:s3cret-pw@127.0.0.1:5672/")

BROKER_COMMANDS = [
    ("dispatch", *AMQP),
    ("dispatch", "--queue", "images", *AMQP),
    ("rabbitmq", "consume", "cli_tasks:app", *AMQP),
    ("rabbitmq", "topology", "--queue", "images", *AMQP),
    ("rabbitmq", "quarantine", "--queue", "images", *AMQP),
    ("worker", "cli_tasks:app", "--delivery", "rabbitmq", *AMQP),
]


@pytest.mark.parametrize("args", BROKER_COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_a_broker_command_without_pika_names_its_extra(
        invoke: Invoke, url: str, monkeypatch: pytest.MonkeyPatch,
        args: tuple[str, ...]) -> None:
    # Given an install without the rabbitmq extra: pika cannot be imported
    monkeypatch.setitem(sys.modules, "pika", None)
    # When a broker command runs
    result = invoke(*args)
    # Then it names the extra to install, in one line, and exits 1
    assert result.exit_code == 1, result.output
    assert result.stderr == ("leaseq: broker delivery needs its extra: "
                             "pip install 'leaseq[rabbitmq]'\n")
    # And it opened no store: the URL's SQLite file was not created
    assert not Path(url.removeprefix("sqlite:///")).exists()
    assert "s3cret-pw" not in result.output


def test_the_dashboard_without_its_extra_names_it(
        invoke: Invoke, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an install without the dashboard extra, When the dashboard is started
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = invoke("dashboard", "--port", "0")
    # Then the same one line names its extra, and no store was opened
    assert result.exit_code == 1, result.output
    assert result.stderr == ("leaseq: the dashboard needs its extra: "
                             "pip install 'leaseq[dashboard]'\n")
    assert not Path(url.removeprefix("sqlite:///")).exists()
