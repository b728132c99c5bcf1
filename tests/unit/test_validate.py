"""Input checks: payloads, job ids, queue names, delays, statuses, URLs and ``connect``."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseq import validate
from leaseq.errors import (
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidQueueName,
    InvalidURL,
)
from leaseq.stores import connect

LIMIT = 1000


def nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    return root


def nested_lists(depth: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(depth):
        node.append([])
        node = node[0]
    return root


# --- payloads ------------------------------------------------------------------------------


def test_payload_gives_canonical_json() -> None:
    assert validate.payload({"b": 1, "a": [1.5, "é"]}, LIMIT) == '{"a":[1.5,"é"],"b":1}'
    assert validate.payload({"b": 1, "a": 2}, LIMIT) == validate.payload({"a": 2, "b": 1}, LIMIT)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf"), [1, float("nan")], {"deep": {"x": float("inf")}}],
    ids=["nan", "inf", "-inf", "nan-in-list", "inf-nested"],
)
def test_nan_and_infinity_are_refused(value: Any) -> None:
    with pytest.raises(InvalidPayload, match="NaN or Infinity"):
        validate.payload({"v": value}, LIMIT)


@pytest.mark.parametrize("payload", [{"v": "a\ud800b"}, {"\udfff": 1}, {"v": ["\ud83d"]}],
                         ids=["in-value", "in-key", "in-list"])
def test_lone_surrogates_are_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayload, match="surrogate"):
        validate.payload(payload, LIMIT)


@pytest.mark.parametrize("build", [nested, nested_lists], ids=["objects", "lists"])
def test_10000_deep_nesting_is_refused_without_crashing(build: Any) -> None:
    with pytest.raises(InvalidPayload, match="nested"):
        validate.payload({"v": build(10_000)}, 10**9)


def _with_leaf(depth: int, leaf: Any, in_list: bool) -> dict[str, Any]:
    """A payload whose ``leaf`` sits ``depth`` levels down (the payload itself is level 0)."""
    node: Any = leaf
    for _ in range(depth - 1):
        node = [node] if in_list else {"x": node}
    return {"v": node}


@pytest.mark.parametrize("in_list", [False, True], ids=["objects", "lists"])
@pytest.mark.parametrize("leaf", [1, "s", None, 1.5, True, [], {}], ids=repr)
def test_a_leaf_is_refused_one_level_past_the_depth_limit(leaf: Any, in_list: bool) -> None:
    # Given the same leaf at level 100 (the deepest allowed) and at level 101
    validate.payload(_with_leaf(100, leaf, in_list), 10**9)
    with pytest.raises(InvalidPayload, match="nested deeper than 100"):
        validate.payload(_with_leaf(101, leaf, in_list), 10**9)


def test_deep_result_is_refused_without_crashing() -> None:
    with pytest.raises(InvalidPayload, match="nested"):
        validate.result(nested_lists(10_000), 10**9)


def test_size_limit_counts_utf8_bytes_and_one_byte_over_is_refused() -> None:
    envelope = len('{"a":""}')
    fits = {"a": "x" * (LIMIT - envelope)}
    assert len(validate.payload(fits, LIMIT).encode()) == LIMIT
    with pytest.raises(InvalidPayload, match=f"{LIMIT + 1} bytes"):
        validate.payload({"a": "x" * (LIMIT - envelope + 1)}, LIMIT)
    # "é" is 2 bytes: a payload that fits in characters can still be over in bytes.
    with pytest.raises(InvalidPayload):
        validate.payload({"a": "é" * (LIMIT // 2)}, LIMIT)


@pytest.mark.parametrize("key", sorted(validate.RESERVED_KEYS))
def test_reserved_keys_are_refused_at_the_top_level(key: str) -> None:
    with pytest.raises(InvalidPayload, match="reserved"):
        validate.payload({key: 1}, LIMIT)
    assert validate.payload({"meta": {key: 1}}, LIMIT)  # nested is the app's business


@pytest.mark.parametrize(
    "payload",
    [{"$set": 1}, {"a": {"$where": 1}}, {"a.b": 1}, {"a": [{"x.y": 1}]}, {"a\x00": 1},
     {1: "x"}],
    ids=["dollar", "nested-dollar", "dot", "dot-in-list", "nul", "int-key"],
)
def test_keys_mongodb_cannot_store_are_refused(payload: dict[Any, Any]) -> None:
    with pytest.raises(InvalidPayload):
        validate.payload(payload, LIMIT)


def test_dollar_inside_a_key_is_fine() -> None:
    assert validate.payload({"price$": 1, "a": {"x$y": 2}}, LIMIT)


@pytest.mark.parametrize("value", [[1, 2], "text", None, 3, b"{}"],
                         ids=["list", "str", "none", "int", "bytes"])
def test_payload_must_be_an_object(value: Any) -> None:
    with pytest.raises(InvalidPayload, match="JSON object"):
        validate.payload(value, LIMIT)


def test_payload_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidPayload, match="not JSON"):
        validate.payload({"when": object()}, LIMIT)


def test_error_message_never_holds_the_whole_payload() -> None:
    secret = "s3cr3t-" + "y" * 5000
    with pytest.raises(InvalidPayload) as raised:
        validate.payload({"a": secret, "b": float("nan")}, LIMIT)
    assert secret not in str(raised.value)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False,
                                                                       allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet="abcxyz_-", min_size=1), children, max_size=4),
    max_leaves=20,
))
def test_valid_payloads_round_trip_through_canonical_json(value: Any) -> None:
    payload = {"v": value}
    try:
        text = validate.payload(payload, 10**7)
    except InvalidPayload as exc:
        assert "surrogate" in str(exc)  # st.text() can make lone surrogates
        return
    assert json.loads(text) == payload


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False,
                                                                       allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(_JSON_VALUES)
def test_canonical_json_is_the_text_json_dumps_writes(value: Any) -> None:
    # The stored payload text is compared with a replay's: it must stay exactly what every
    # earlier version wrote (json.dumps with these arguments), whatever the encoder's shortcut.
    try:
        want = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
        want.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate: refused by canonical_json, checked above
    assert validate.canonical_json(value, 10**7, "payload") == want


def test_canonical_json_refuses_a_cycle_as_too_deep() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        validate.canonical_json(looped, LIMIT, "result")


# --- ids, names, delays, statuses, error text ----------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["", None, 12, "x" * 513, "é" * 256 + "a", "a\x00b", "a\ud800"],
    ids=["empty", "none", "int", "513-bytes", "513-bytes-utf8", "nul", "lone-surrogate"],
)
def test_bad_job_ids_are_refused(value: Any) -> None:
    with pytest.raises(InvalidJobId):
        validate.job_id(value)


@pytest.mark.parametrize("value", ["x" * 512, "é" * 256, "file:123", "🙂"])
def test_good_job_ids(value: str) -> None:
    assert validate.job_id(value) == value


@pytest.mark.parametrize("name", ["jobs", "a", "A1.b_c-d", "x" * 64])
def test_good_queue_names(name: str) -> None:
    assert validate.queue_name(name) == name


@pytest.mark.parametrize("name", ["", "-jobs", ".jobs", "a b", "a/b", "x" * 65, "é", None, 3,
                                  "jobs\n"])
def test_bad_queue_names(name: Any) -> None:
    with pytest.raises(InvalidQueueName):
        validate.queue_name(name)


@pytest.mark.parametrize("value", [-1, -0.001, float("nan"), float("inf"), True, "5", None,
                                   10 * 365 * 86400 + 1, 10**400])
def test_bad_delays(value: Any) -> None:
    with pytest.raises(InvalidInput):
        validate.delay_s(value)


def test_good_delays() -> None:
    assert validate.delay_s(0) == 0.0 and isinstance(validate.delay_s(3), float)
    assert validate.delay_s(10 * 365 * 86400) == 10 * 365 * 86400


@pytest.mark.parametrize("status", ["pending", "processing", "Done", "", "a-b", "x" * 65, 1])
def test_bad_terminal_statuses(status: Any) -> None:
    with pytest.raises(InvalidInput):
        validate.terminal_status(status)


@pytest.mark.parametrize("status", ["done", "failed", "skipped_too_large", "tombstone"])
def test_good_terminal_statuses(status: str) -> None:
    assert validate.terminal_status(status) == status


def test_error_text_keeps_its_last_2000_characters() -> None:
    text = "HEAD" + "x" * 3000 + "TAIL"
    kept = validate.error_text(text)
    assert kept == text[-2000:] and kept.endswith("TAIL") and len(kept) == 2000
    assert validate.error_text("short") == "short"
    assert validate.error_text(None) is None


# --- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:hunter2@db.example:5432/jobs",
        "postgresql://app:hunter2@db.example/jobs?sslmode=require&password=hunter2",
        "mongodb://app:hunter2@h1,h2,h3/?replicaSet=rs0",
        "postgresql://db.example/jobs?user=app&PASSWORD=hunter2",
        "postgresql://app:hunter2@host:notaport/jobs",
    ],
)
def test_redacted_url_never_shows_the_password(url: str) -> None:
    shown = validate.redact_url(url)
    assert "hunter2" not in shown
    assert "***" in shown


def test_redaction_keeps_the_rest() -> None:
    assert validate.redact_url("postgresql://app:pw@db:5432/jobs?sslmode=require") == (
        "postgresql://app:***@db:5432/jobs?sslmode=require")
    assert validate.redact_url("sqlite:///jobs.db") == "sqlite:///jobs.db"
    # a parameter whose name holds a secret word ("session") but says which server to use
    assert validate.redact_url("postgresql://h/db?target_session_attrs=read-write&"
                               "session_key=x") == (
        "postgresql://h/db?target_session_attrs=read-write&session_key=***")


@given(st.text(min_size=1, max_size=40))
def test_redaction_hides_any_password(raw: str) -> None:
    password = "PW" + raw  # a marker that cannot collide with the rest of the URL
    url = f"postgresql://app:{quote(password, safe='')}@db.example/jobs"
    shown = validate.redact_url(url)
    assert quote(password, safe="") not in shown and password not in shown


@pytest.mark.parametrize("url", ["redis://app:hunter2@cache:6379/0", "ftp://x:hunter2@h",
                                 "mysql+pymysql://u:hunter2@h/db"])
def test_connect_refuses_an_unknown_scheme_without_echoing_the_password(url: str) -> None:
    with pytest.raises(InvalidURL) as raised:
        connect(url)
    assert "hunter2" not in str(raised.value)
    assert isinstance(raised.value, InvalidInput)


def test_connect_refuses_a_non_string_url() -> None:
    with pytest.raises(InvalidURL):
        connect(b"sqlite:///x.db")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["", "x" * 1025, "a\x00b", 7, "out/report-\udcff.csv"])
def test_a_bad_result_key_is_refused(key: object) -> None:
    with pytest.raises(InvalidPayload):
        validate.result_key(key)


def test_a_result_key_round_trips() -> None:
    assert validate.result_key("s3://bucket/out/j1.json") == "s3://bucket/out/j1.json"
    assert validate.result_key(None) is None


@pytest.mark.parametrize("call", [
    lambda q: q.claim_one("j", 123),
    lambda q: q.claim_one("j", None),
    lambda q: q.claim_one("j", "w\x00"),
    lambda q: q.claim("w\ud800"),
    lambda q: q.list_jobs(limit=-1),
    lambda q: q.list_jobs(limit=2**70),
    lambda q: q.list_jobs(status=""),
    lambda q: q.list_jobs(after_id="a\x00"),
    lambda q: q.outbox_due(-1),
    lambda q: list(q.iter_jobs(page_size=0)),
    lambda q: q.spec("j", {}, task="a\x00b"),
    lambda q: q.spec("j", {}, revision="r\x00"),
    # a lone surrogate (a file name from os.listdir) reached the driver, which refused it
    # with a bare UnicodeEncodeError
    lambda q: q.spec("j", {}, task="a\udcff"),
    lambda q: q.spec("j", {}, revision="r\udcff"),
    lambda q: q.spec("j", {}, concurrency_key="tenant-\udcff"),
    lambda q: q.list_jobs(status="done\udcff"),
    lambda q: q.enqueue("k", {}, delay_s=10**400),
], ids=["claim_one int worker", "claim_one no worker", "claim_one NUL worker",
        "claim surrogate worker", "negative limit", "huge limit", "empty status",
        "NUL after_id", "negative outbox limit", "zero page size", "NUL task", "NUL revision",
        "surrogate task", "surrogate revision", "surrogate key", "surrogate status",
        "huge int delay"])
def test_bad_queue_call_arguments_are_refused_alike_on_every_store(tmp_path: Any,
                                                                   call: Any) -> None:
    # Each reached the store before: SQLite took an int worker id, a NULL one or no limit at
    # all; PostgreSQL raised its driver's errors
    store = connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        q = store.queue("q")
        q.enqueue("j", {})
        with pytest.raises(InvalidInput):
            call(q)
        assert q.get("j").status == "pending"
    finally:
        store.close()
