"""``leaseq dashboard``: on loopback with no credentials it prints a one-time login URL that
signs in once; beyond loopback it refuses to start without credentials; --read-only serves a
dashboard that refuses every action."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from leaseq.cli import cli
from leaseq.stores.base import Store


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Instead of serving: the app and options ``leaseq dashboard`` would serve, then the
    test's probe (the first item, if any) called on them while the command's store is open."""
    apps: list[Any] = []

    def serve(config: Any, listening: socket.socket) -> None:
        host, port = listening.getsockname()[:2]
        apps.append((config.app, {"host": host, "port": port}))
        if apps and callable(apps[0]):
            apps[0](config.app, {"host": host, "port": port})

    monkeypatch.setattr("leaseq.cli.dashboard.serve", serve)
    return apps


def url_of(store: Store) -> str:
    return store.url


def test_loopback_without_credentials_prints_a_one_time_login_url(
    store: Store, served: list[Any]
) -> None:
    def probe(app: Any, options: dict[str, Any]) -> None:
        assert options["host"] == "127.0.0.1"
        bound.append(options["port"])
        token = app.state.dashboard.auth.token
        client = TestClient(app)
        assert client.get("/").status_code == 401
        assert client.get(f"/login?token={token}").status_code == 200
        assert TestClient(app).get(f"/login?token={token}").status_code == 401  # spent
        seen.append(token)

    seen: list[str] = []
    bound: list[int] = []
    served.append(probe)
    # --port 0: the system picks one, and the URL names the port really served
    result = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--port", "0"])
    assert result.exit_code == 0, result.output
    ((port, printed),) = re.findall(r"http://127\.0\.0\.1:(\d+)/login\?token=(\S+)",
                                    result.output)
    assert seen == [printed] and bound == [int(port)] and int(port) > 0


def test_a_port_already_taken_is_one_line_and_no_login_url(store: Store,
                                                           served: list[Any]) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--port",
                                          str(port)])
    finally:
        taken.close()
    assert result.exit_code == 2, result.output
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in result.output
    assert "login" not in result.output and served == []


def test_beyond_loopback_credentials_are_required(store: Store, served: list[Any]) -> None:
    refused = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "--user and --password" in refused.output
    half = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--user", "a"])
    assert half.exit_code == 2
    assert served == []


@pytest.mark.parametrize("credentials", [["--user", "", "--password", ""],
                                         ["--user", "ops", "--password", ""],
                                         ["--user", "", "--password", "pw"]],
                         ids=["both-empty", "empty-password", "empty-user"])
def test_empty_credentials_are_refused(store: Store, served: list[Any],
                                       credentials: list[str]) -> None:
    # An unset shell variable (--password "$PW") would otherwise serve every action beyond
    # loopback to a login of just ":".
    refused = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--host", "0.0.0.0",
                                       *credentials])
    assert refused.exit_code == 2 and "must not be empty" in refused.output
    assert served == []


def test_read_only_refuses_every_action(store: Store, served: list[Any]) -> None:
    def probe(app: Any, options: dict[str, Any]) -> None:
        client = TestClient(app, headers={"Authorization": "Basic b3BzOnB3"})  # ops:pw
        page = client.get("/jobs?queue=mail").text
        assert 'name="action"' not in page
        token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)[1]  # type: ignore[index]
        forged = client.post("/action", data={"csrf_token": token, "queue": "mail",
                                              "action": "cancel", "job_id": "p-0"})
        assert forged.status_code == 403
        seen.append(forged.status_code)

    seen: list[int] = []
    served.append(probe)
    result = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--host", "0.0.0.0",
                                      "--user", "ops", "--password", "pw", "--read-only"])
    assert result.exit_code == 0, result.output
    assert seen == [403]
    # And it said where it serves, and as whom, never the password
    assert re.search(r"open http://0\.0\.0\.0:\d+/ \(basic auth, as ops\)", result.output)
    assert "pw" not in result.output
