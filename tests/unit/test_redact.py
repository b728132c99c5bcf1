"""The redactor: every secret form it knows is masked wherever it sits in a text, and text
without secrets comes out as it went in (but for long random-looking runs)."""

from __future__ import annotations

import json
import logging
import re
import string
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from leaseq import App, Permanent
from leaseq.errors import InvalidInput
from leaseq.job import safe_reason
from leaseq.redact import (
    Redactor,
    combined,
    fields_masker,
    has_ambiguous_userinfo,
    redact,
    redact_tail,
    redact_url,
    traceback_text,
)
from leaseq.worker import Worker, WorkerConfig

SECRET = "Zq9hunter2canary"
HEX = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize("text", [
    f"could not connect to postgresql://app:{SECRET}@db.example:5432/jobs",
    f"redis://:{SECRET}@cache:6379/0 refused the connection",
    f"GET https://api.example/v1/items?page=2&access_token={SECRET} returned 401",
    f"token={SECRET}",
    f"DB_PASSWORD={SECRET} PGHOST=db",
    f"client_secret: {SECRET}",
    f'upstream said {{"api_key": "{SECRET}", "ok": false}}',
    f"{{'password': '{SECRET} with spaces', 'n': 1}}",
    f'{{"nested": {{"privateKey": "{SECRET}"}}}}',
    f"headers: Authorization: Bearer {SECRET}",
    f"Proxy-Authorization: Basic {SECRET}",
    f"Cookie: sessionid={SECRET}; theme=dark",
    f"retrying with 'Bearer {SECRET}'",
    f"Basic {SECRET}==",
    f"signature {HEX} does not match",
    f"key_{HEX[:40]} revoked",
    "aws said: InvalidAccessKeyId wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY " + SECRET[:0],
    f'data="token={SECRET}"',
    f'password="x "api_key": "{SECRET}"',
    f"password={SECRET}",
    f"X-Api-Key={SECRET}",
    f"set-cookie: a={SECRET}",
    str({"user": "bob", "password": SECRET.encode()}),
    str({"api_key": [SECRET, "x"]}),
    str({"token": ("a", SECRET)}),
    str({"secret": {"k": SECRET}}),
    json.dumps({"tokens": [{"v": SECRET}]}, indent=2),
    json.dumps({"request": json.dumps({"api_key": SECRET})}),
    json.dumps(json.dumps(json.dumps({"password": SECRET}))),
    f"connect(host='db', password=SecretStr('{SECRET}'))",
    f"'line one\\ntoken={SECRET}'",
    f'{{"password" => "{SECRET}", "user" => "bob"}}',
    f"api_key=> {SECRET}",
    f"password:\n  {SECRET}\nuser: bob",
    f"<password>{SECRET}</password>",
    f'<soap:Header><wsse:Password Type="PasswordText">{SECRET}</wsse:Password></soap:Header>',
    f"<token><![CDATA[{SECRET}<&]]></token>",
])
def test_each_secret_form_is_masked(text: str) -> None:
    shown = redact(text)
    assert SECRET not in shown and HEX[:32] not in shown
    assert "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY" not in shown
    assert "***" in shown


@pytest.mark.parametrize("text", [
    "ValueError: could not parse the upstream answer",
    "KeyError: 'size'",
    "FileNotFoundError: [Errno 2] No such file or directory: '/srv/app/data/input-2024-01.csv'",
    "job 123e4567-e89b-12d3-a456-426614174000 of queue thumbnails: HTTP 503 after 30.0 s",
    "ConnectionError: https://api.example.com/v1/items?page=2 timed out",
    "payload does not fit task 'resize': argument 'width' should be int, got str",
    "expected 3 columns, got 4 at line 17: a=1, b=2",
    'the answer was {"status": "busy", "retry_after": 30}',
    "/usr/lib/python3.11/site-packages/leaseq/runner.py line 80",
    json.dumps({"request": json.dumps({"status": "busy", "ids": [1, 2]})}),
    "C:\\\\share\\\\data\\\\input.csv not found",
])
def test_ordinary_errors_are_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "shown"), [
    ("{'user': 'bob', 'password': b'Zq9a'}", "{'user': 'bob', 'password': b'***'}"),
    ("{'pwd': u'Zq9a', 'secret': rb'Zq9a'}", "{'pwd': u'***', 'secret': rb'***'}"),
    ("{'api_key': ['Zq9a', 'x'], 'n': 1}", "{'api_key': ***, 'n': 1}"),
    ("{'token': ('a', 'Zq9a'), 'n': 1}", "{'token': ***, 'n': 1}"),
    ("{'secret': {'k': 'v]'}, 'n': 1}", "{'secret': ***, 'n': 1}"),
    ('{"request": "{\\"api_key\\": \\"Zq9a\\", \\"n\\": 1}"}',
     '{"request": "{\\"api_key\\": \\"***\\", \\"n\\": 1}"}'),
    ("connect(password=SecretStr('Zq9a'), host='db')", "connect(password=***, host='db')"),
    ('{"token" => "Zq9a", "n" => 1}', '{"token" => "***", "n" => 1}'),
    ("<user>bob</user><password>Zq9a</password><n>1</n>",
     "<user>bob</user><password>***</password><n>1</n>"),
    ("<token><![CDATA[Zq9a<b>]]></token><n>1</n>", "<token><![CDATA[***]]></token><n>1</n>"),
    ("<password/><n>1</n>", "<password/><n>1</n>"),
    ("db:\n  password: correct horse battery\n  user: bob",
     "db:\n  password: ***\n  user: bob"),
    ("- token: two words  \r\n- n: 1", "- token: ***\r\n- n: 1"),
    ("[db]\npassword = my pass ; old\nport = 5432", "[db]\npassword = ***\nport = 5432"),
    ("secret = a b user=bob", "secret = *** user=bob"),
    ("token=Zq9a and then some", "token=*** and then some"),  # key=word, as in a shell
    ("db:\n  password: |\n    Zq9a\n\n    Zq9b\n  user: bob\n",
     "db:\n  password: ***\n  user: bob\n"),
    ("private_key: >-\n  Zq9a\n  Zq9b\nhost: db", "private_key: ***\nhost: db"),
    ("password: |2+ # kept\n   Zq9a\nhost: db", "password: ***\nhost: db"),
    ("password:\nuser: bob", "password:\nuser: bob"),  # no value: the next key is kept
    ("error: token: expired now", "error: token: *** now"),  # not the line's first key
])
def test_a_secrets_whole_value_is_masked_and_the_rest_kept(text: str, shown: str) -> None:
    # Given a pair whose value is bytes, a list, a tuple, a dict, escaped JSON or a call
    # When it is redacted, Then the value is masked up to its own end, and no further
    assert redact(text) == shown


@pytest.mark.parametrize("text", [
    "{'api_key': ['Zq9a', 'Zq9b'",  # cut short
    "token: ('Zq9a', 'it\\'s\\n Zq9b",  # an escaped quote, then cut
    "session: (the user's Zq9b)",  # a stray apostrophe
    "{'secret': {'k': ['Zq9a'}, 'n': 'Zq9b'}",  # brackets that do not match
    "password: [\n  'Zq9a',\n  'Zq9b'",  # pretty-printed over lines, cut short
    '{"request": "{\\"api_key\\": \\"Zq9a, more text Zq9b',  # escaped JSON cut short
    "<secret>Zq9a and more Zq9b",  # an element cut short
    "<token><![CDATA[Zq9a <b> Zq9b",  # a CDATA section cut short
])
def test_a_value_never_closed_is_masked_to_the_end_of_the_text(text: str) -> None:
    # Given a secret's value whose bracket or escaped quote is never closed
    # When it is redacted, Then everything after the key is masked: where the value stops
    # cannot be told, and the next line may still be part of it
    shown = redact(text)
    assert "Zq9" not in shown and shown.endswith("***")


def test_the_run_rule_has_its_threshold() -> None:
    short, long = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"
    assert redact(f"id {short}") == f"id {short}"  # 31 hex characters
    assert redact(f"id {long}") == "id ***"
    assert Redactor(min_run_chars=0)(f"id {long}") == f"id {long}"
    assert Redactor(min_run_chars=40)(f"id {long}") == f"id {long}"


def test_a_redactor_takes_more_secret_keys_and_its_own_mask() -> None:
    mine = Redactor(secret_keys=("iban",), mask="[hidden]")
    assert mine("customer_iban=DE44500105175407324931 token=x") == (
        "customer_iban=[hidden] token=[hidden]")
    assert redact("customer_iban=DE44500105175407324931") == (
        "customer_iban=DE44500105175407324931")


@pytest.mark.parametrize("options", [{"secret_keys": "iban"}, {"secret_keys": ("",)},
                                     {"min_run_chars": 4}, {"min_run_chars": True},
                                     {"mask": None}])
def test_a_bad_redactor_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        Redactor(**options)  # type: ignore[arg-type]


def test_the_reason_and_the_tail_are_redacted_before_they_are_cut() -> None:
    # A secret whose key would be cut off by the 500-character cut is masked first
    error = ValueError(f"password={SECRET}" + "x" * 495)
    assert SECRET[-5:] not in safe_reason(error)
    assert safe_reason(error).startswith("ValueError: ")
    assert redact_tail(f"token={SECRET} " + "y" * 10, 12) == "* " + "y" * 10


def test_a_traceback_keeps_its_frames_and_masks_every_message() -> None:
    try:
        try:
            raise KeyError(f"token={SECRET}")
        except KeyError as inner:
            raise RuntimeError(f"postgresql://app:{SECRET}@db/jobs") from inner
    except RuntimeError as exc:
        text = traceback_text(exc)
    assert SECRET not in text
    assert "test_redact.py" in text and 'raise KeyError(f"token={SECRET}")' in text
    assert "RuntimeError: postgresql://app:***@db/jobs" in text


@pytest.mark.timeout(30)
def test_a_long_text_is_redacted_in_linear_time() -> None:
    # Inputs that make a careless pattern backtrack for minutes take well under a second each
    # here (the timeout is the bound: a quadratic pattern on these lengths runs for hours)
    for text in ("a=" * 50_000, "x:" * 50_000, "a://b:c" * 50_000, "'password'" * 50_000,
                 "a" * 400_000, "\\" * 400_000, '\\"a\\": ' * 50_000, "\\\\'" * 100_000,
                 '\\\\\\"x' * 100_000, "<a" * 100_000, "<a>" * 100_000, "a =>" * 100_000,
                 "\n" * 400_000, " " * 400_000 + "a: x"):
        assert redact(text) == text
    # ... and a long run of secrets is still every one of them masked
    assert redact('token="' * 50_000) == 'token="***"' * 25_000
    for text in ("token=[" * 50_000, "token=f(" * 50_000, 'token=\\"' * 50_000,
                 "token: {'a': \"" * 50_000, "token=['x']" * 50_000,
                 "\ntoken: |" * 50_000, "\n - token = a b c" * 50_000,
                 "token: |\n" + " x\n" * 100_000):
        assert "token" in redact(text)


# --- properties ------------------------------------------------------------------------

TOKEN = string.ascii_letters + string.digits + "-_.~+/"
#: What a secret may hold in each carrier: unquoted values end at a space or a delimiter, a
#: URL's password is percent-encoded, a quoted value ends at its quote.
UNQUOTED = st.text(TOKEN + "=:!@$%^*|", min_size=1, max_size=40)
URL_PASSWORD = st.text(string.ascii_letters + string.digits + "-_.~%!$*+=:", max_size=40)
QUOTED = st.text(st.characters(blacklist_characters='"\\\n\r', blacklist_categories=("Cs",)),
                 max_size=40)
KEYS = st.sampled_from(["password", "passwd", "pwd", "token", "secret", "api_key", "apikey",
                        "access_key", "authorization", "cookie", "session", "private_key",
                        "client_secret", "DB_PASSWORD", "x-api-key", "refresh_token",
                        "AWS_SECRET_ACCESS_KEY", "sessionid"])
CARRIERS = {
    "url": (URL_PASSWORD, lambda s, k: f"postgresql://app:{s}@db.example:5432/jobs"),
    "pair": (UNQUOTED, lambda s, k: f"{k}={s}"),
    "colon": (UNQUOTED, lambda s, k: f"{k}: {s}"),
    "json": (QUOTED, lambda s, k: f'{{"{k}": "{s}", "n": 1}}'),
    "dict": (QUOTED.filter(lambda s: "'" not in s), lambda s, k: f"{{'{k}': '{s}'}}"),
    "bearer": (st.text(TOKEN, min_size=1, max_size=40), lambda s, k: f"Bearer {s}"),
    "header": (st.text(TOKEN + " =;,:", min_size=1, max_size=40).map(str.strip).filter(bool),
               lambda s, k: f"Authorization: {s}"),
    "bytes": (QUOTED.filter(lambda s: "'" not in s), lambda s, k: f"{{'{k}': b'{s}', 'n': 1}}"),
    "list": (QUOTED.filter(lambda s: "'" not in s), lambda s, k: f"{{'{k}': ['a', '{s}']}}"),
    "tuple": (QUOTED.filter(lambda s: "'" not in s), lambda s, k: f"{{'{k}': ('{s}',)}}"),
    "object": (QUOTED, lambda s, k: f'{{"{k}": {{"v": ["{s}"]}}, "n": 1}}'),
    "escaped": (QUOTED, lambda s, k: json.dumps({"body": json.dumps({k: s}, ensure_ascii=False)},
                                               ensure_ascii=False)),
    "call": (QUOTED.filter(lambda s: "'" not in s), lambda s, k: f"f({k}=Secret('{s}'))"),
    "arrow": (QUOTED, lambda s, k: f'{{"{k}" => "{s}", "n" => 1}}'),
    "next-line": (UNQUOTED, lambda s, k: f"{k}:\n    {s}\n"),
    "yaml-line": (st.text(TOKEN + " =:!@$%^*|", min_size=1, max_size=40),
                  lambda s, k: f"\n  {k}: {s}\n"),
    "ini-line": (st.text(TOKEN + " :!@$%^*|", min_size=1, max_size=40),
                 lambda s, k: f"\n{k} = {s}\n"),
    "yaml-block": (st.lists(st.text(TOKEN + " :#", min_size=1, max_size=20), min_size=1,
                            max_size=3).map("\n      ".join),
                   lambda s, k: f"\n  {k}: |\n      {s}\n  n: 1"),
    "xml": (QUOTED.filter(lambda s: "<" not in s), lambda s, k: f"<{k}>{s}</{k}>"),
    "cdata": (QUOTED.filter(lambda s: "]]>" not in s), lambda s, k: f"<{k}><![CDATA[{s}]]></{k}>"),
}


@given(st.sampled_from(sorted(CARRIERS)), st.data(), KEYS, st.text(max_size=60),
       st.text(max_size=60))
@example("json", None, "api_key", 'password="x', "")
def test_a_secret_in_any_text_never_survives(carrier: str, data: st.DataObject, key: str,
                                              before: str, after: str) -> None:
    # Given a secret in one of the forms the redactor knows, with any text around it
    values, render = CARRIERS[carrier]
    secret = "Zq9" + (data.draw(values) if data is not None else "s3cret")
    assume(secret not in before + after)
    # When the text is redacted
    shown = redact(f"{before} {render(secret, key)} {after}")
    # Then the secret is not in it
    assert secret not in shown


@given(KEYS, st.text(max_size=40).filter(lambda s: ":" not in s), st.integers(1, 3))
@example("api_key", 'a"b\\c\'d', 3)
def test_escaped_json_keeps_its_shape_and_loses_the_secret(key: str, secret: str,
                                                           depth: int) -> None:
    # Given a JSON object with a secret, dumped into a JSON string ``depth`` times (secrets
    # with a ":" left out: a header or URL rule could mask across their escaped quotes)
    text = json.dumps({key: "Zq9" + secret, "n": [1, "x"]})
    for _ in range(depth):
        text = json.dumps({"body": text})
    # When it is redacted
    shown = redact(text)
    # Then it still parses, down to the object, whose secret alone is masked
    for _ in range(depth):
        shown = json.loads(shown)["body"]
    assert json.loads(shown) == {key: "***", "n": [1, "x"]}


@given(st.binary(min_size=24, max_size=64), st.text(max_size=60), st.text(max_size=60))
def test_a_long_random_token_never_survives(raw: bytes, before: str, after: str) -> None:
    import base64

    for token in (raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw)
                  .decode().rstrip("=")):
        # Random bytes may, rarely, make a token of one letter case or no digit: such a run
        # looks like a word and is kept. Real keys and tokens are long enough not to.
        assume(any(c.isdigit() for c in token) and any(c.isalpha() for c in token))
        if token != raw.hex():
            assume(any(c.isupper() for c in token) and any(c.islower() for c in token))
        assume(token not in before + after)
        assert token not in redact(f"{before} {token} {after}")


NO_SECRET_WORDS = re.compile(r"password|passwd|pwd|passphrase|token|secret|api.?key|access.?key"
                             r"|private.?key|authorization|cookie|session|credential|signature"
                             r"|bearer|basic|://|\*\*\*", re.IGNORECASE)


@given(st.text(max_size=300))
@example("expected 3 columns: a=1, b=2 at /srv/data/run-2024/input.csv")
def test_text_without_secrets_changes_only_in_long_runs(text: str) -> None:
    # Given text that names no secret (whatever else it holds)
    assume(not NO_SECRET_WORDS.search(text))
    # When it is redacted
    shown = redact(text)
    # Then only long base64 / hex runs were masked, the rest is unchanged
    pieces = [re.escape(p) for p in shown.split("***")]
    assert re.fullmatch(r"[A-Za-z0-9+/_=-]{32,}".join(pieces), text, re.DOTALL), (text, shown)
    assert Redactor(min_run_chars=0)(text) == text


# --- the app's redactor on the way to the journal, the record and the log --------------


def test_the_apps_redactor_masks_the_journal_the_record_and_the_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given an app with a redactor of its own, and handlers whose errors carry a secret
    host = "internal" + "-host"  # not in the source line a traceback shows

    def mine(text: str) -> str:
        return redact(text).replace(host, "[host]")

    app = App(f"sqlite:///{tmp_path / 'jobs.db'}", redact=mine,
              queues={"q": {"max_attempts": 1}})

    @app.task(queue="q")
    def leaky(form: str) -> None:
        if form == "url":
            raise ConnectionError(f"cannot reach postgresql://app:{SECRET}@{host}/db")
        raise Permanent(f'upstream said {{"api_key": "{SECRET}"}}')

    leaky.enqueue(form="url", job_id="url")
    leaky.enqueue(form="json", job_id="json")
    # When a worker runs them
    with caplog.at_level(logging.DEBUG, logger="leaseq"):
        Worker(app, WorkerConfig(burst=True, concurrency=1, idle_max_s=0.05)).run()
    # Then neither the journal, nor the record's error, nor the log holds the secret,
    # and the app's own rule was applied
    q = app.queue("q")
    assert q.redact is app.redact
    for job_id in ("url", "json"):
        job = q.get(job_id)
        assert job is not None and job.status == "failed"
        texts = [job.error or "", *(e.reason or "" for e in q.journal(job_id))]
        assert not [t for t in texts if SECRET in t or "internal-host" in t], texts
    assert "postgresql://app:***@[host]/db" in (q.get("url").error or "")  # type: ignore[union-attr]
    assert SECRET not in caplog.text and host not in caplog.text
    assert "cannot reach" in caplog.text  # the log still says what happened


def test_an_app_refuses_a_redactor_that_is_not_a_function() -> None:
    with pytest.raises(InvalidInput):
        App(redact="no")  # type: ignore[arg-type]


def test_a_failing_redactor_is_stood_in_for_by_the_built_in_one(
        caplog: pytest.LogCaptureFixture) -> None:
    # Given app redactors that raise, or return no text
    def broken(text: str) -> str:
        raise RuntimeError(text)

    for mine in (broken, lambda text: None):
        # When an error text passes them, Then the built-in redactor masks it instead
        shown = App(redact=mine).redact(f"token={SECRET}")  # type: ignore[arg-type]
        assert shown == "token=***"
    assert SECRET not in caplog.text and "the app's redactor failed" in caplog.text
    assert App(redact=redact).redact is redact


def test_combined_redactors_apply_each_distinct_one_once() -> None:
    # Given two apps' redactors, one counting its calls
    calls: list[str] = []

    def hides_host(text: str) -> str:
        calls.append(text)
        return text.replace("db.example", "[host]")

    # When they are combined (one given twice), Then a text passes each, the counted one once
    both = combined([hides_host, redact, hides_host])
    assert both(f"postgresql://app:{SECRET}@db.example/x") == "postgresql://app:***@[host]/x"
    assert len(calls) == 1
    # And one redactor is itself, none is the built-in one
    assert combined([hides_host]) is hides_host and combined([]) is redact


#: Passwords holding, unencoded, a character that moves where a parser ends the userinfo.
#: Each piece between those characters is distinctive, so a piece echoed anywhere is found.
UNENCODED_PASSWORDS = ["Qxz/Vwk9", "Qxz#Vwk9", "Qxz?Vwk9", "Qxz@Vwk9", "Qxz:Vwk9",
                       "Qxz/Vwk9@Mnb?Tyu#Plo:Kji"]
URL_FORMS = ["amqp://guest:{}@rabbit:5672/%2f", "postgresql://app:{}@db.example:5432/jobs",
             "mongodb://app:{}@mongo.example:27017/jobs", "sqlite://app:{}@host/jobs.db",
             "redis://app:{}@cache:6379/0?token=Zq9k"]


def pieces(password: str) -> list[str]:
    return [p for p in re.split(r"[/#?@:]", password) if p]


def url_openers() -> list[object]:
    from leaseq import connect
    from leaseq.delivery.connection import connection_parameters
    from leaseq.stores.postgres.options import parse_url as parse_pg_url
    openers: list[object] = [connect, connection_parameters, parse_pg_url]
    try:
        from leaseq.stores.mongodb.connection import parse_url as parse_mongo_url
    except ImportError:  # the mongo extra is not installed
        return openers
    return [*openers, parse_mongo_url]


@pytest.mark.parametrize("password", UNENCODED_PASSWORDS)
@pytest.mark.parametrize("form", URL_FORMS)
def test_redact_url_masks_a_password_holding_unencoded_delimiters(form: str, password: str) -> None:
    # Given a URL whose password is not percent-encoded
    url = form.format(password)
    # When it is shown, on its own or inside an error text
    shown = [redact_url(url), redact(f"could not reach {url} in time")]
    # Then no piece of the password is left
    assert [p for p in pieces(password) for text in shown if p in text] == []
    assert "Zq9k" not in shown[0]


@pytest.mark.parametrize("password", [p for p in UNENCODED_PASSWORDS if p != "Qxz:Vwk9"])
@pytest.mark.parametrize("form", URL_FORMS)
@pytest.mark.parametrize("opener", url_openers(), ids=lambda f: getattr(f, "__module__", "?"))
def test_a_url_parsers_cannot_agree_on_is_refused_without_any_piece_of_its_password(
    opener: Callable[[str], object], form: str, password: str
) -> None:
    # Given a URL whose userinfo parsers read differently (libpq stops at the first "@" or
    # "/", Python's parser at the first "/" and then the last "@")
    url = form.format(password)
    # When any of leaseq's URL readers is given it, Then it is refused, and neither the error
    # nor anything it was raised from quotes a piece of the password
    with pytest.raises(InvalidInput) as raised:
        opener(url)
    told = f"{raised.value} {raised.value.__cause__} {raised.value.__context__}"
    assert [p for p in pieces(password) if p in told] == []


@pytest.mark.parametrize("url", [
    "postgresql://db.example/jobs?application_name=ops@example.com",
    "postgresql://app:Zq9k@db.example:5432/jobs?application_name=ops@example.com",
    "postgresql://[::1]/jobs?application_name=a@b", "amqp://rabbit/vhost@eu",
    "mongodb://mongo.example:27017/jobs?appName=a@b"])
def test_an_at_sign_after_a_plain_host_is_the_urls_own(url: str) -> None:
    # Given URLs whose "@" after the authority belongs to their path or query
    # Then they read one way: no reader refuses them, and the host stays in sight
    assert not has_ambiguous_userinfo(url)
    assert "example" in redact_url(url) or "[::1]" in redact_url(url) or "rabbit" in redact_url(url)
    assert "Zq9k" not in redact_url(url)


def test_masked_fields_masks_a_secret_keys_whole_value_at_any_depth() -> None:
    # Given a payload with secrets held in lists and objects, beside plain fields
    payload = {"password": ["Zq9a"], "api_key": {"v": "Zq9b"}, "to": "a@example.com",
               "items": [{"Refresh_Token": 12}, {"n": [1, {"x-api-key": None}]}]}
    # When its fields are masked by key
    masked = Redactor().masked_fields(payload)
    # Then each secret-named key keeps its name and loses its whole value; the rest is as it
    # was, and the payload itself is untouched
    assert masked == {"password": "***", "api_key": "***", "to": "a@example.com",
                      "items": [{"Refresh_Token": "***"}, {"n": [1, {"x-api-key": "***"}]}]}
    assert payload["password"] == ["Zq9a"]


def test_fields_masker_uses_the_redactors_own_secret_keys() -> None:
    assert fields_masker(Redactor(secret_keys=("iban",)))({"IBAN": ["x"]}) == {"IBAN": "***"}
    assert fields_masker(lambda text: text)({"token": {"a": 1}}) == {"token": "***"}
