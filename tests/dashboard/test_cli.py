"""``leaseq dashboard``: on loopback with no credentials it prints a one-time login URL that
signs in once; beyond loopback it refuses to start without credentials; --read-only serves a
dashboard that refuses every action."""

from __future__ import annotations

import re
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
    import uvicorn

    def run(app: Any, **options: Any) -> None:
        apps.append((app, options))
        if apps and callable(apps[0]):
            apps[0](app, options)

    monkeypatch.setattr(uvicorn, "run", run)
    return apps


def url_of(store: Store) -> str:
    return store.url


def test_loopback_without_credentials_prints_a_one_time_login_url(
    store: Store, served: list[Any]
) -> None:
    def probe(app: Any, options: dict[str, Any]) -> None:
        assert (options["host"], options["port"]) == ("127.0.0.1", 9999)
        token = app.state.dashboard.auth.token
        client = TestClient(app)
        assert client.get("/").status_code == 401
        assert client.get(f"/login?token={token}").status_code == 200
        assert TestClient(app).get(f"/login?token={token}").status_code == 401  # spent
        seen.append(token)

    seen: list[str] = []
    served.append(probe)
    result = CliRunner().invoke(cli, ["dashboard", "--url", url_of(store), "--port", "9999"])
    assert result.exit_code == 0, result.output
    (printed,) = re.findall(r"http://127\.0\.0\.1:9999/login\?token=(\S+)", result.output)
    assert seen == [printed]


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
