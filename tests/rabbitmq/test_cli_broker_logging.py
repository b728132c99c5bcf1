"""What the broker commands log: leaseq's own lines, not pika's narration of every channel, and
no pika traceback for each failed connect (leaseq says why in one line)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from leaseq.redact import redact_url
from leaseq.testing.harness import wait_until

HERE = Path(__file__).parent
SECRET = "s3cret-pw"


class Command:
    """One CLI process, its stdout and stderr in one log file."""

    def __init__(self, folder: Path, *args: str):
        self.log = folder / f"cli-{os.getpid()}-{len(list(folder.glob('cli-*')))}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", *args], env=env,
                                         stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        return self.text()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Command]]:
    commands: list[Command] = []
    yield commands
    for command in commands:
        if command.proc.poll() is None:
            command.proc.kill()
            command.proc.wait()


def wrong_password(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{SECRET}@{parts.hostname}:"
                                            f"{parts.port or 5672}"))


def broker_commands(store_url: str, amqp_url: str) -> dict[str, list[str]]:
    common = ["--url", store_url, "--amqp-url", amqp_url, "--queue", "jobs"]
    return {"worker": ["worker", "procs:app", "--delivery", "rabbitmq", *common],
            "consume": ["rabbitmq", "consume", "procs:app", *common, "-v"],
            "dispatch": ["dispatch", *common, "-v"]}


def test_a_consumer_logs_no_pika_chatter(amqp_url: str, tmp_path: Path, started) -> None:
    # Given a consumer started by `leaseq worker --delivery rabbitmq` (INFO by default)
    args = broker_commands(f"sqlite:///{tmp_path / 'jobs.db'}", amqp_url)["worker"]
    started.append(command := Command(tmp_path, *args))
    # When it has declared its topology and consumes
    wait_until(lambda: "consuming jobs" in command.text(), "the consumer consuming",
               timeout_s=60)
    text = command.stop()
    # Then its log holds leaseq's lines, none of pika's INFO narration of its channels
    assert "consuming jobs" in text
    assert " INFO pika" not in text, text


@pytest.mark.parametrize("name", ["worker", "consume", "dispatch"])
def test_a_refused_login_is_retried_without_a_traceback(
        broker_url: str, tmp_path: Path, started, name: str) -> None:
    # Given a broker command whose RabbitMQ refuses its login
    args = broker_commands(f"sqlite:///{tmp_path / 'jobs.db'}", wrong_password(broker_url))
    started.append(command := Command(tmp_path, *args[name]))
    # When it has tried to connect twice
    wait_until(lambda: command.text().count("reconnecting in") >= 2, "two retries",
               timeout_s=60)
    text = command.stop()
    # Then no try printed a traceback (pika's or leaseq's), nor the password
    assert "Traceback" not in text, text
    assert SECRET not in text


def refused_port(amqp_url: str) -> str:
    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parts = urlsplit(amqp_url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{SECRET}@127.0.0.1:{port}"))


@pytest.mark.parametrize("name, what", [("dispatch", "dispatcher"), ("consume", "consumer"),
                                        ("worker", "consumer")])
@pytest.mark.parametrize("broken, cause", [(refused_port, "connection refused"),
                                           (wrong_password, "login refused")],
                         ids=["refused", "login"])
def test_each_retry_names_the_masked_url_and_the_cause(
        broker_url: str, tmp_path: Path, started, name: str, what: str, broken, cause) -> None:
    # Given a broker command whose RabbitMQ cannot be connected to
    url = broken(broker_url)
    args = broker_commands(f"sqlite:///{tmp_path / 'jobs.db'}", url)[name]
    started.append(command := Command(tmp_path, *args))
    # When it has tried twice
    wait_until(lambda: command.text().count("reconnecting in") >= 2, "two retries",
               timeout_s=60)
    text = command.stop()
    # Then each try is one line naming the URL, its password masked, and the cause
    masked = redact_url(url)
    retries = [line for line in text.splitlines() if "reconnecting in" in line]
    expected = f"{what}: cannot connect to RabbitMQ at {masked}: {cause}; reconnecting in"
    assert all(expected in line for line in retries), text
    assert SECRET not in text


def test_a_missing_vhost_is_named_as_such(broker_url: str, tmp_path: Path, started) -> None:
    # Given a dispatcher pointed at a vhost that does not exist (the right password)
    url = urlunsplit(urlsplit(broker_url)._replace(path="/no-such-vhost"))
    started.append(command := Command(
        tmp_path, *broker_commands(f"sqlite:///{tmp_path / 'jobs.db'}", url)["dispatch"]))
    # When it has tried once
    wait_until(lambda: "reconnecting in" in command.text(), "a retry", timeout_s=60)
    # Then the line says the vhost was not found
    assert f"at {redact_url(url)}: vhost not found; reconnecting in" in command.stop()
