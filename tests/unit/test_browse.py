"""The job browser's index walk (``leaseq.browse.walk``): pages fill from matching rows, a walk
stops at its row cap and says so, and the next page goes on from where it stopped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from leaseq.browse import JobFilter, actor_name, batches, prefix_end, walk
from leaseq.errors import InvalidInput


def table(n: int, every: int) -> list[tuple[None, str, bool]]:
    """``n`` rows in id order, one in ``every`` matching the filter."""
    return [(None, f"id-{i:05d}", i % every == 0) for i in range(n)]


def fetcher(rows: list[tuple[None, str, bool]], reads: list[int]):
    def fetch(key, after_id, n):
        start = 0 if after_id is None else next(
            i for i, r in enumerate(rows) if r[1] == after_id) + 1
        reads.append(n)
        return rows[start:start + n]
    return fetch


def test_an_unfiltered_page_costs_one_read_of_its_size() -> None:
    reads: list[int] = []
    ids, cursor, capped = walk(fetcher(table(100, 1), reads), 10, None)
    assert ids == [f"id-{i:05d}" for i in range(10)] and not capped
    assert reads == [10]
    more, _, _ = walk(fetcher(table(100, 1), reads), 10, cursor)
    assert more[0] == "id-00010"


def test_a_selective_filter_stops_at_the_cap_and_goes_on_from_there() -> None:
    rows = table(10_000, 1000)  # ten matches, far apart
    reads: list[int] = []
    ids, cursor, capped = walk(fetcher(rows, reads), 50, None, cap=2500)
    assert (ids, capped) == (["id-00000", "id-01000", "id-02000"], True)
    assert sum(reads) == 2500  # never more than the cap
    seen = list(ids)
    while cursor is not None:
        ids, cursor, capped = walk(fetcher(rows, reads), 50, cursor, cap=2500)
        seen.extend(ids)
    assert seen == [f"id-{i:05d}" for i in range(0, 10_000, 1000)]


def test_the_end_of_the_index_ends_the_walk() -> None:
    ids, cursor, capped = walk(fetcher(table(7, 2), []), 50, None)
    assert (ids, cursor, capped) == (["id-00000", "id-00002", "id-00004", "id-00006"], None,
                                     False)


def test_a_cursor_that_no_store_gave_is_refused() -> None:
    for bad in ("nonsense", "[1, 2]", '{"a": 1}'):
        with pytest.raises(InvalidInput):
            walk(fetcher(table(3, 1), []), 5, bad)


def test_helpers() -> None:
    assert prefix_end("ab") == "ac" and prefix_end("a\U0010ffff") == "b"
    assert prefix_end("ab") > "ab\U0010ffffzz" and prefix_end("ab") <= "ac"
    # past U+D7FF comes U+E000: a surrogate, which no store can take, is skipped
    assert prefix_end("a\ud7ff") == "a\ue000"
    assert actor_name("  alice \n  evil ") == "alice evil" and actor_name("") == "unknown"
    assert len(actor_name("x" * 500)) == 100
    assert batches(["a", "b", "a", "c"], 2) == [["a", "b"], ["c"]]
    assert JobFilter("q", status="", task="").status is None
    with pytest.raises(InvalidInput):
        JobFilter("q", error_text="x" * 201)


def test_a_bound_without_a_time_zone_is_taken_as_utc() -> None:
    # A naive bound meant UTC on PostgreSQL, local time on SQLite, and a TypeError on MongoDB
    naive = datetime(2024, 1, 2, 3, 4, 5)
    where = JobFilter("q", updated_from=naive, updated_until=naive)
    assert where.updated_from == where.updated_until == naive.replace(tzinfo=UTC)
    aware = datetime(2024, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    assert JobFilter("q", updated_from=aware).updated_from == aware
    with pytest.raises(InvalidInput, match="updated_from must be a datetime"):
        JobFilter("q", updated_from="2024-01-02")  # type: ignore[arg-type]


def test_a_slow_walk_stops_at_its_time_cap_and_goes_on_from_there() -> None:
    # Given an index whose every read takes 0.1 s (an injected clock), one match in 5,000
    now = [0.0]
    rows = table(20_000, 5000)
    inner = fetcher(rows, [])

    def slow(key, after_id, n):
        now[0] += 0.1
        return inner(key, after_id, n)

    # When a page may take 0.25 s, Then it stops after three reads, capped, with a cursor
    ids, cursor, capped = walk(slow, 50, None, time_cap_s=0.25, clock=lambda: now[0])
    assert capped and cursor is not None and now[0] == pytest.approx(0.3)
    assert ids == ["id-00000"]
    # And the next page starts where that one stopped
    more, _, _ = walk(slow, 50, cursor, time_cap_s=10, clock=lambda: now[0])
    assert more == ["id-05000", "id-10000", "id-15000"]
