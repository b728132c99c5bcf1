"""The journal tells the same story on PostgreSQL as on SQLite, read through ``leaseq inspect
--json``: for a job done at once, one retried, one whose worker vanished mid-attempt (its lease
ran out and another worker took it, the trace a SIGKILL leaves) and one revised while pending.
PostgreSQL keeps a bare creation in the record rather than in a journal row; the story must not
show it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli import cli
from leaseq.testing.harness import advance

LEASE_S = 30.0


def _act(store: leaseq.Store) -> None:
    """The four jobs' lives, on the store's own clock (moved, never slept on)."""
    q = store.queue("stories")
    q.enqueue("done", {"n": 1})
    q.enqueue("retried", {"n": 2})
    q.enqueue("vanished", {"n": 3})
    q.enqueue("revised", {"n": 4})
    q.enqueue("revised", {"n": 5}, revision="r2", on_conflict="replace")
    claimed = {job.id: job for job in q.claim("host-a:1:w", 4, lease_s=LEASE_S)}
    q.complete(claimed["done"], {"ok": True})
    q.retry_later(claimed["retried"], "timed out talking to the API", delay_s=0)
    q.complete(claimed["revised"], {"ok": True})
    # host-a is killed holding "vanished": nothing finishes it, its lease runs out
    advance(store, LEASE_S + 1)
    again = {job.id: job for job in q.claim("host-b:2:w", 4, lease_s=LEASE_S)}
    assert sorted(again) == ["retried", "vanished"]
    for job in again.values():
        q.complete(job, {"ok": True})


def _stories(url: str) -> dict[str, list[tuple[object, ...]]]:
    runner = CliRunner()
    out = {}
    for job_id in ("done", "retried", "vanished", "revised"):
        result = runner.invoke(cli, ["inspect", job_id, "--queue", "stories", "--json"],
                               env={"LEASEQ_URL": url})
        assert result.exit_code == 0, result.output
        entries = json.loads(result.output)["journal"]
        out[job_id] = [(e["event"], e["reason"], e["attempt"],
                        (e.get("worker_id") or "").split(":")[0]) for e in entries]
    return out


@pytest.fixture
def stores(schema_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    urls = {"sqlite": f"sqlite:///{tmp_path / 'jobs.db'}", "postgresql": schema_url}
    for url in urls.values():
        with leaseq.connect(url) as store:
            _act(store)
    yield urls


def test_inspect_tells_each_story_alike_on_sqlite_and_postgresql(
        stores: dict[str, str]) -> None:
    sqlite, postgresql = _stories(stores["sqlite"]), _stories(stores["postgresql"])
    assert postgresql == sqlite
    # And each story is the one that happened
    assert [e[0] for e in sqlite["done"]] == ["enqueued", "claimed", "result_saved"]
    assert [e[0] for e in sqlite["retried"]] == [
        "enqueued", "claimed", "retry_scheduled", "claimed", "result_saved"]
    assert [(e[0], e[3]) for e in sqlite["vanished"]][:2] == [("enqueued", ""),
                                                              ("claimed", "host-a")]
    assert [e[0] for e in sqlite["vanished"]][-2:] == ["claimed", "result_saved"]
    assert sqlite["vanished"][-2][1:4] == ("redelivered", 2, "host-b")
    assert [(e[0], e[1]) for e in sqlite["revised"]][:2] == [("enqueued", "created"),
                                                            ("enqueued", "updated")]
