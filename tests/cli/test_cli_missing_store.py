"""A URL with no leaseq store behind it (a mistyped SQLite file): the commands that read, or
act on jobs already there, say so in one line and exit 1, creating nothing; those that write
create the store as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

Invoke = Callable[..., Result]

READERS = [
    ("status",), ("status", "--json"), ("doctor",), ("doctor", "--json"), ("inspect", "j1"),
    ("failed",), ("requeue", "j1"), ("requeue", "--all-failed"), ("retry", "j1"),
    ("cancel", "j1"), ("schedules",), ("schedules", "history", "nightly"),
    ("schedules", "pause", "nightly"), ("schedules", "resume", "nightly"),
    ("schedules", "trigger", "nightly"), ("rabbitmq", "republish", "--older-than-s", "60"),
]


@pytest.fixture
def db(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_a_reader_on_a_missing_file_exits_1_and_makes_no_file(
    invoke: Invoke, url: str, db: Path, args: tuple[str, ...]
) -> None:
    # Given a URL naming a SQLite file that does not exist
    # When a command that reads runs on it
    result = invoke(*args)
    # Then it says so in one line, with the way to create the store, and made nothing
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"leaseq: no leaseq store at {url}; nothing was created there. Check the URL; to "
        "create the store there, run `leaseq migrate` with this URL (a worker or an enqueue "
        "creates it too)\n")
    assert list(db.parent.iterdir()) == []


def test_metrics_on_a_missing_file_creates_the_store_as_a_worker_does(
        invoke: Invoke, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The exporter starts beside the workers, maybe before any: it must not fail for a store
    # that the first enqueue will create
    class Served(Exception):
        pass

    def serve(*args: object, **kwargs: object) -> None:
        raise Served

    monkeypatch.setattr("leaseq.cli.ops.Metrics.serve", serve)
    result = invoke("metrics", "--port", "0")
    assert isinstance(result.exception, Served), result.output
    assert db.exists()


def test_the_dashboard_on_a_missing_file_serves_nothing(invoke: Invoke, db: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    uvicorn = pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.append(app))
    result = invoke("dashboard", "--port", "0")
    assert result.exit_code == 1 and "no leaseq store at" in result.output
    assert served == [] and list(db.parent.iterdir()) == []


def test_enqueue_still_creates_the_store(invoke: Invoke, db: Path) -> None:
    result = invoke("enqueue", "--task", "t", "--payload", "{}", "--job-id", "j1")
    assert result.exit_code == 0, result.output
    assert db.exists()
    assert invoke("inspect", "j1").exit_code == 0


def test_status_on_an_existing_store_reads_it(invoke: Invoke) -> None:
    # Given a store made by `leaseq migrate`, When status reads it, Then it is empty and fine
    assert invoke("migrate").exit_code == 0
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "no jobs yet"


@pytest.mark.parametrize("args", [("enqueue", "--task", "t", "--payload", "{}"), ("status",)],
                         ids=" ".join)
def test_an_empty_url_is_refused_not_read_as_the_environments(
        invoke: Invoke, db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        args: tuple[str, ...]) -> None:
    # Given $LEASEQ_URL naming one store, and a --url that came out empty (a variable unset
    # in a deploy script), run where a default leaseq.db would land
    monkeypatch.chdir(tmp_path)
    # When a command runs with it
    result = invoke(args[0], "--url", "", *args[1:])
    # Then it is refused in one line: the job went neither into $LEASEQ_URL's store nor into
    # a new leaseq.db
    assert result.exit_code == 1, result.output
    assert result.output == ("leaseq: the store URL is empty: give one, or leave it out for "
                             "$LEASEQ_URL (then sqlite:///leaseq.db)\n")
    assert list(tmp_path.iterdir()) == []
