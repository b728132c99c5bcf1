"""``leaseq.journal``: the one home of the journal's event names and fixed reasons, and the
SQL stores' queries naming them through it."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from leaseq.journal import RENAMED_EVENTS, JournalEvent, sql_literals
from leaseq.stores.sql import load_queries

SQL_STORES = ("leaseq.stores.sqlite", "leaseq.stores.postgres")


def test_the_events_are_the_designed_ones_and_the_old_name_reads_as_the_new() -> None:
    assert {e.value for e in JournalEvent} == {
        "enqueued", "claimed", "heartbeat_lost", "result_saved", "retry_scheduled", "snoozed",
        "given_back", "quarantined", "reclaimed", "requeued", "cancelled", "published",
        "received", "ack_sent", "publish_owed", "edited", "deleted", "operator_action",
        "lease_abandoned"}
    assert RENAMED_EVENTS["retried"] is JournalEvent.REQUEUED


def test_every_word_the_sql_names_is_a_plain_literal() -> None:
    literals = sql_literals()
    assert literals["event.claimed"] == "'claimed'"
    for key, literal in literals.items():
        assert re.fullmatch(r"'[^']*'", literal), key  # no quote inside: safe to inline


@pytest.mark.parametrize("package", SQL_STORES)
def test_no_query_spells_an_event_itself(package: str) -> None:
    # Given the queries as written, Then every journal row's event comes from JournalEvent
    folder = resources.files(package).joinpath("queries")
    text = "".join(f.read_text(encoding="utf-8") for f in folder.iterdir()
                   if f.name.endswith(".sql"))
    spelled = {e.value for e in JournalEvent if f"{{now}}, '{e.value}'" in text}
    assert spelled == set()
    assert "{event.claimed}" in text or "{event.heartbeat_lost}" in text


def test_a_placeholder_nothing_fills_is_refused(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a query naming an event that does not exist
    package = tmp_path / "leaseq_test_badsql"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "q.sql").write_text("-- name: bad\nSELECT {event.clamed};\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # When it is loaded, Then the loader says which query and which placeholder
    with pytest.raises(ValueError, match=r"'bad' names \{event\.clamed\}"):
        load_queries("leaseq_test_badsql", "q.sql", **sql_literals())
