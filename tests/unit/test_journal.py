"""``leaseq.journal``: the one home of the journal's event names and fixed reasons, and the
SQL stores' queries naming them through it."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from string import Formatter

import pytest

from leaseq import journal
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


def test_a_comment_is_not_part_of_the_query_above_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the comment that introduces a query, naming a parameter of that query: it sat at
    # the end of the query above, where psycopg read %(batch)s as a parameter it lacked
    package = tmp_path / "leaseq_test_comments"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "q.sql").write_text(
        "-- name: exists\nSELECT 1 WHERE id = %(id)s;\n\n"
        "-- One batch (%(batch)s jobs at most) of a purge.\n"
        "-- name: purge\nDELETE FROM jobs -- the rest\nLIMIT %(batch)s;\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # When it is loaded, Then each query holds its own lines only (an inline comment stays)
    queries = load_queries("leaseq_test_comments", "q.sql")
    assert queries == {"exists": "SELECT 1 WHERE id = %(id)s;",
                       "purge": "DELETE FROM jobs -- the rest\nLIMIT %(batch)s;"}


def _template_fields() -> set[str]:
    texts = [v for k, v in vars(journal).items() if k.isupper() and isinstance(v, str)]
    return {name for text in texts for _, name, _, _ in Formatter().parse(text) if name}


@pytest.mark.parametrize("package", SQL_STORES)
def test_every_field_a_query_fills_is_a_field_of_a_journal_template(package: str) -> None:
    # Given the queries as written: replace(%(template)s, '{field}', value) finds nothing to
    # replace when the field is misspelt, and the template would be written as it is
    folder = resources.files(package).joinpath("queries")
    text = "".join(f.read_text(encoding="utf-8") for f in folder.iterdir()
                   if f.name.endswith(".sql"))
    filled = set(re.findall(r"'\{([a-z_]+)\}'", text))
    # Then every field they fill is one the templates have
    assert filled and filled <= _template_fields()


def test_the_templates_write_the_words_stored_jobs_already_carry() -> None:
    assert journal.SNOOZED_OUT.format(n=3) == "snoozed 3 times without finishing"
    assert journal.GIVEN_BACK_OUT.format(n=1) == (
        "given back 1 times while its handler ran; its attempts are spent")
    assert journal.LEASE_EXPIRED_ON.format(attempt=1, max_attempts=2) + journal.HELD_BY.format(
        worker="w") == "lease expired on attempt 1 of 2 (worker w)"
    assert journal.SPENT_WHILE_PENDING_ERROR.format(attempt=3, max_attempts=2) == (
        "attempts spent while pending (3 of 2)")
    assert journal.LEASE_LOST.format(lease_epoch=1, status="done", job_epoch=2) == (
        "lease epoch 1 lost; job is done at epoch 2")
    assert journal.BY_ACTOR.format(actor="alice") == "by alice"
