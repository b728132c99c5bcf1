"""A broker command that connects once and cannot (a port nobody listens on, a wrong password, a
vhost that does not exist) says so in one line on stderr, the password masked, and exits 1:
no pika traceback."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner

from leaseq.cli import cli

SECRET = "s3cret-pw"

COMMANDS = [("rabbitmq", "topology", "--queue", "jobs"),
            ("rabbitmq", "topology", "--queue", "jobs", "--no-declare"),
            ("rabbitmq", "quarantine", "--queue", "jobs")]


def with_netloc(url: str, *, password: str | None = None, port: int | None = None,
                vhost: str | None = None) -> str:
    parts = urlsplit(url)
    user = parts.username or "guest"
    netloc = (f"{user}:{password or parts.password}@{parts.hostname}:"
              f"{port or parts.port or 5672}")
    return urlunsplit((parts.scheme, netloc, vhost or parts.path, "", ""))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused(amqp_url: str) -> tuple[str, str]:
    return with_netloc(amqp_url, password=SECRET, port=free_port()), "connection refused"


def bad_login(amqp_url: str) -> tuple[str, str]:
    return with_netloc(amqp_url, password=SECRET), "login refused"


def no_vhost(amqp_url: str) -> tuple[str, str]:
    return with_netloc(amqp_url, vhost="/leaseq-no-such-vhost"), "vhost not found"


@pytest.mark.parametrize("case", [refused, bad_login, no_vhost],
                         ids=["refused", "login", "vhost"])
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_broker_that_cannot_be_used_is_one_line(broker_url: str, case, args) -> None:
    # Given a RabbitMQ URL that cannot be used, for the reason the case makes
    url, cause = case(broker_url)
    # When a broker command that connects once is run with it
    result = CliRunner().invoke(cli, [*args, "--amqp-url", url])
    # Then it exits 1 with one line naming the masked URL and the cause, and no traceback
    masked = url.replace(f":{urlsplit(url).password}@", ":***@")
    assert result.exit_code == 1, result.output
    assert result.stderr == f"leaseq: cannot connect to RabbitMQ at {masked}: {cause}\n"
    # And no password anywhere in what it printed
    assert SECRET not in result.output and "guest:guest" not in result.output
