"""Scenario 8, the bad-input corpus through the API and the CLI (``leaseq enqueue``) → each
input is refused with a typed error (exit 2 and one line on the CLI) or round-trips exactly;
nothing else in the store changes; a worker then runs every accepted job and survives."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from click.testing import CliRunner

from leaseq import InvalidInput, LeaseqError, QueuePolicy
from leaseq.cli import cli
from leaseq.testing.chaos import Run, all_terminal, jobs_by_id, settle, wait_until

LIMIT = 4096  # the queue's max_payload_bytes, small so "at the limit" is cheap to send
DROP = "'; DROP TABLE leaseq_jobs; --"


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _at_limit(extra: int, limit: int = LIMIT) -> dict[str, str]:
    overhead = len('{"s":""}')
    return {"s": "x" * (limit - overhead + extra)}


CLI_LIMIT = QueuePolicy().max_payload_bytes  # the CLI's queue has the default policy


# (name, job id, payload, accepted?)
API_CORPUS: list[tuple[str, str, Any, bool]] = [
    ("payload at the size limit", "b-limit", _at_limit(0), True),
    ("payload one byte over", "b-over", _at_limit(1), False),
    ("10,000-deep nesting", "b-deep", {"d": _deep(10_000)}, False),
    ("NaN", "b-nan", {"x": float("nan")}, False),
    ("Infinity", "b-inf", {"x": float("inf")}, False),
    ("lone surrogate (invalid UTF-8)", "b-surrogate", {"x": "\udcff"}, False),
    ("bytes value", "b-bytes", {"x": b"\xff"}, False),
    ("NUL in a value", "b-nul", {"x": "a\x00b"}, True),
    ("NUL in a key", "b-nulkey", {"a\x00b": 1}, False),
    ("SQL injection as value", "b-sql", {"q": DROP}, True),
    ("SQL injection as job id", DROP, {"q": 1}, True),
    ("{'$gt': ''}", "b-gt", {"$gt": ""}, False),
    ("$where", "b-where", {"$where": "sleep(1000)"}, False),
    ("nested $ key", "b-nested", {"a": {"$ne": 1}}, False),
    ("key with a dot", "b-dot", {"a.b": 1}, False),
    ("'$where' as a value", "b-where-value", {"w": "$where", "g": {"v": "$gt"}}, True),
    ("reserved key", "b-reserved", {"status": "done"}, False),
    ("not an object", "b-list", [1, 2, 3], False),
    ("unicode and big numbers", "b-uni", {"u": "żółw 🐢 \u2028", "big": 2**70,
                                          "neg": -0.0, "f": 1e308}, True),
    ("NUL in the job id", "b-\x00", {"x": 1}, False),
    ("job id of 513 bytes", "é" * 256 + "x", {"x": 1}, False),
]

# (name, --payload text or None for stdin, stdin text, accepted?)
CLI_CORPUS: list[tuple[str, str | None, str | None, bool]] = [
    ("invalid JSON", "{not json", None, False),
    ("JSON that is not an object", "[1, 2]", None, False),
    ("NaN", '{"x": NaN}', None, False),
    ("$gt", '{"$gt": ""}', None, False),
    ("SQL injection", json.dumps({"q": DROP}), None, True),
    ("NUL escaped", '{"x": "a\\u0000b"}', None, True),
    ("10,000-deep nesting", None, '{"d": ' + "[" * 10_000 + "]" * 10_000 + "}", False),
    ("at the limit (stdin)", None, json.dumps(_at_limit(0, CLI_LIMIT)), True),
    ("one byte over (stdin)", None, json.dumps(_at_limit(1, CLI_LIMIT)), False),
]


def run(r: Run) -> None:
    store = r.open()
    q = store.queue("chaos", max_payload_bytes=LIMIT)
    sentinels = [f"sentinel-{i}" for i in range(5)]
    q.enqueue_many([q.spec(i, {"n": k}, task="echo") for k, i in enumerate(sentinels)])
    before = jobs_by_id(q)
    accepted: list[str] = list(sentinels)
    wrong: list[str] = []
    for name, job_id, payload, ok in API_CORPUS:
        got = _api(q, job_id, payload)
        if got is True and ok:
            stored = q.get(job_id)
            if stored is None or stored.payload != payload:
                wrong.append(f"API {name}: not an exact round trip")
            accepted.append(job_id)
        elif got is not ok:
            wrong.append(f"API {name}: {'accepted' if got is True else got}")
    for k, (name, text, stdin, ok) in enumerate(CLI_CORPUS):
        job_id = f"cli-{k}"
        code, out = _cli(r, job_id, text, stdin)
        if ok and code == 0:
            accepted.append(job_id)
        elif ok or code != 2 or "Traceback" in out or len(out.strip().splitlines()) > 4:
            wrong.append(f"CLI {name}: exit {code}: {out.strip()[-300:]}")
    code, out = _cli_process(r, b'{"x": "\xff\xfe"}')
    if code != 2 or "Traceback" in out:
        wrong.append(f"CLI invalid UTF-8 argv: exit {code}: {out.strip()[-300:]}")
    r.counts.jobs_in = len(API_CORPUS) + len(CLI_CORPUS) + 1
    r.check("each input refused with a typed error or round-tripped exactly", not wrong,
            "; ".join(wrong))
    now = jobs_by_id(q)
    r.check("nothing else changed",
            all(now.get(i) == j for i, j in before.items()) and set(now) == set(accepted),
            f"{sorted(set(now) ^ set(accepted))[:5]}")
    ledger = r.ledger()
    worker = r.worker("w", concurrency=4, extra=["--burst"]).start()
    status = worker.wait(60)
    r.check("the worker loop survived the corpus (burst exit 0)", status == 0,
            f"exit {status}: {worker.output()[-500:]}")
    wait_until(all_terminal(q, accepted), 10)
    settle(r, q, accepted, ledger, reruns_allowed=False)


def _api(q, job_id: str, payload: Any) -> bool | str:  # type: ignore[no-untyped-def]
    """True when accepted; else the error, "typed" when it was a LeaseqError."""
    try:
        q.enqueue(job_id, payload, task="echo")
    except InvalidInput:
        return False
    except LeaseqError as exc:
        return f"unexpected {type(exc).__name__}"
    except Exception as exc:
        return f"untyped {type(exc).__name__}: {str(exc)[:100]}"
    return True


def _cli(r: Run, job_id: str, text: str | None, stdin: str | None) -> tuple[int, str]:
    args = ["enqueue", "--url", r.url, "--queue", "chaos", "--task", "echo", "--job-id", job_id]
    if text is not None:
        args += ["--payload", text]
    result = CliRunner().invoke(cli, args, input=stdin)
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        out += f"\nTraceback: {type(result.exception).__name__}: {result.exception}"
    return result.exit_code, out


def _cli_process(r: Run, payload: bytes) -> tuple[int, str]:
    """A real ``leaseq enqueue`` with argv bytes that are not UTF-8."""
    command = [sys.executable.encode(), b"-m", b"leaseq.cli", b"enqueue", b"--url",
               r.url.encode(), b"--queue", b"chaos", b"--task", b"echo", b"--payload", payload]
    done = subprocess.run(command, capture_output=True, timeout=60, env=r.worker_env())
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")
