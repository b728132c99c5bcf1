"""Every ``leaseq`` command, its output, and its bad-argument and bad-database paths."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

import leaseq

Invoke = Callable[..., Result]

HERE = Path(__file__).parent
#: A terminal wide enough that rich wraps no story line.
WIDE = {"COLUMNS": "300"}


def given_failed(store: leaseq.Store, job_id: str, queue: str = "images") -> None:
    q = store.queue(queue)
    q.enqueue(job_id, {"path": job_id}, task="resize")
    (job,) = q.claim("w", 1)
    q.fail(job, ValueError("corrupt header"), "permanent")


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_then_replay(invoke: Invoke, store: leaseq.Store) -> None:
    args = ("enqueue", "--queue", "images", "--task", "resize", "--payload", '{"path": "a.png"}',
            "--job-id", "file:1")
    first, again = invoke(*args), invoke(*args)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == "created: job file:1 in queue images"
    assert again.output.startswith("unchanged")
    job = store.get("images", "file:1")
    assert job is not None and (job.task, job.payload) == ("resize", {"path": "a.png"})


def test_enqueue_payload_from_stdin_with_revision_and_delay(
    invoke: Invoke, store: leaseq.Store
) -> None:
    result = invoke("enqueue", "--task", "resize", "--job-id", "j", "--revision", "r1",
                    "--delay-s", "60", "--json", input='{"path": "b.png"}')
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"queue": "default", "job_id": "j", "outcome": "created"}
    assert store.get("default", "j").revision == "r1"  # type: ignore[union-attr]
    assert store.ready("default") == 0


def test_an_enqueue_conflict_is_told_in_the_commands_words(invoke: Invoke) -> None:
    # Given a job "x" stored with one payload
    assert invoke("enqueue", "--task", "t", "--job-id", "x", "--payload", '{"n": 1}'
                  ).exit_code == 0
    # When it is enqueued again with another and no revision
    result = invoke("enqueue", "--task", "t", "--job-id", "x", "--payload", '{"n": 2}')
    # Then it fails (1) saying what to pass on the command line, not the Python API's options
    assert result.exit_code == 1
    assert "Give --revision R" in result.output and "on_conflict" not in result.output


def test_enqueue_checks_the_payload_against_the_app(
    invoke: Invoke, store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    ok = invoke("enqueue", "--app", "cli_tasks:app", "--task", "resize", "--job-id", "x",
                "--payload", '{"path": "a.png", "width": 64}')
    assert ok.exit_code == 0, ok.output
    assert store.get("images", "x") is not None  # the task's queue
    bad = invoke("enqueue", "--app", "cli_tasks:app", "--task", "resize", "--job-id", "y",
                 "--payload", '{"width": "wide"}')
    assert bad.exit_code == 2
    assert "missing argument(s) path" in bad.output and "Usage:" in bad.output
    assert store.get("images", "y") is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "--payload", "{}"], "Missing option '--task'"),
        (["enqueue", "--task", "t", "--payload", "{nope"], "not JSON"),
        (["enqueue", "--task", "t", "--payload", "[1]"], "must be a JSON object"),
        (["enqueue", "--task", "t", "--payload", '{"a":' * 10_000 + "1" + "}" * 10_000],
         "nested too deeply"),
        (["enqueue", "--task", "t", "--payload", "{}", "--delay-s", "-1"], "--delay-s"),
        (["enqueue", "--task", "t", "--payload", '{"id": 1}'], "reserved"),
        (["enqueue", "--task", "t", "--payload", "{}", "--queue", "no spaces"], "queue name"),
        (["enqueue", "--task", "t", "--payload", "{}", "--app", "nocolon"], "MODULE:APP"),
        # an empty --job-id (a producer's "$ID" unset) was a new random job on every replay
        (["enqueue", "--task", "t", "--payload", "{}", "--job-id", ""], "job id"),
        (["enqueue", "--task", "t", "--payload", "{}", "--delay-s", "nan"], "finite"),
        (["enqueue", "--task", "t", "--payload", "{}", "--delay-s", "inf"], "finite"),
    ],
)
def test_enqueue_bad_arguments_exit_2(invoke: Invoke, args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Usage:" in result.output


# --- status, inspect, failed ------------------------------------------------------------------


def test_status_table_and_json(invoke: Invoke, store: leaseq.Store) -> None:
    q = store.queue("images")
    q.enqueue("a", {"path": "a"}, task="resize")
    q.enqueue("b", {"path": "b"}, task="resize", delay_s=3600)
    given_failed(store, "c")
    table = invoke("status")
    assert table.exit_code == 0, table.output
    assert "images" in table.output and "ready" in table.output
    data = json.loads(invoke("status", "--json").output)
    images = data["queues"]["images"]
    assert images["counts"] == {"pending": 2, "failed": 1}
    assert images["ready"] == 1
    assert images["oldest_pending_age_s"] >= 0
    nothing = invoke("status", "--json", "--queue", "nothing")
    only = json.loads(nothing.stdout)
    assert only["queues"]["nothing"] == {"counts": {}, "ready": 0, "in_flight": 0,
                                         "held_back": {"by_key": 0, "by_rate": 0},
                                         "oldest_pending_age_s": 0.0}
    # And a queue with no jobs is named as such (a typo must not read as an empty queue)
    assert nothing.exit_code == 0
    assert "no jobs in queue(s): nothing (is the name right?)" in nothing.stderr
    assert "no jobs" not in invoke("status", "--queue", "images").stderr
    # And a name no queue can have is refused, as by every other command
    refused = invoke("status", "--queue", "bad/queue")
    assert refused.exit_code == 2 and "queue" in refused.output
    q.claim("host:1:abcd", 1)
    assert json.loads(invoke("status", "--json").output)["queues"]["images"]["in_flight"] == 1


def test_status_shows_ready_jobs_held_back_by_a_limit(invoke: Invoke,
                                                     store: leaseq.Store) -> None:
    # Given a key-limited queue whose claim left two jobs of a full key waiting
    q = store.queue("exports", key_limit=1)
    for i in range(3):
        q.enqueue(f"e{i}", {"n": i}, concurrency_key="tenant:42")
    assert len(q.claim("host:1:abcd", 5)) == 1
    # When status is asked, without the app's policy
    data = json.loads(invoke("status", "--json").output)["queues"]["exports"]
    table = invoke("status")
    # Then the held-back jobs are counted as the limit the claims ran with says
    assert (data["ready"], data["held_back"]) == (2, {"by_key": 2, "by_rate": 0})
    assert "held" in table.output


def test_inspect_shows_the_budget_a_job_spent(invoke: Invoke, store: leaseq.Store) -> None:
    # Given a job snoozed once and given back once while its handler ran
    q = store.queue("images")
    q.enqueue("s", {"path": "p"}, task="resize")
    (job,) = q.claim("host:1:abcd", 1)
    q.snooze(job, 0)
    (job,) = q.claim("host:1:abcd", 1)
    q.give_back(job, started=True, reason="worker shutting down")
    # When it is inspected
    story = invoke("inspect", "s")
    # Then the record shows both counters and the story names the give-back
    assert story.exit_code == 0, story.output
    assert "snoozes" in story.output and "givebacks" in story.output
    assert "given back, ready at once" in story.output
    data = json.loads(invoke("inspect", "s", "--json").output)
    assert (data["job"]["snoozes"], data["job"]["givebacks"]) == (1, 1)


def test_inspect_tells_an_event_written_under_its_old_name_as_the_event_today(
        invoke: Invoke, store: leaseq.Store) -> None:
    # Given a journal row written when requeued was still called retried
    q = store.queue("images")
    q.enqueue("s", {}, task="resize")
    store.append_journal("images", "s", "retried", reason="operator")
    # When the story is told, Then it says what the event means today
    story = invoke("inspect", "s")
    assert story.exit_code == 0, story.output
    assert "requeued by an operator" in story.output and "retried" not in story.output


def test_inspect_tells_the_story(invoke: Invoke, store: leaseq.Store) -> None:
    q = store.queue("images", backoff_base_s=0)
    q.enqueue("s", {"path": "secret-path"}, task="resize")
    (job,) = q.claim("host:1:abcd", 1)
    q.retry_later(job, ConnectionError("timed out"), 0)
    (job,) = q.claim("host:2:ef01", 1)
    q.complete(job, {"ok": True})
    story = invoke("inspect", "s")
    assert story.exit_code == 0, story.output
    for words in ("enqueued", "claimed", "attempt 1", "by host:1:abcd", "will be retried",
                  "ConnectionError: timed out", "redelivered", "finished", "done"):
        assert words in story.output, words
    assert "secret-path" not in story.output  # the payload is summarised, never shown
    assert '{"ok": true}' in story.output  # the result as the JSON it is, not a Python repr
    data = json.loads(invoke("inspect", "s", "--queue", "images", "--json").output)
    assert data["job"]["status"] == "done" and data["job"]["attempts"] == 2
    assert [e["event"] for e in data["journal"]] == [
        "enqueued", "claimed", "retry_scheduled", "claimed", "result_saved"]


def test_inspect_tells_how_long_the_job_waited_and_each_attempt_ran(
        invoke: Invoke, store: leaseq.Store) -> None:
    # Given a job claimed 30 s after its enqueue, retried after 20 s, then done 15 s into its
    # second attempt (the store's clock moved back so the times are known)
    q = store.queue("images", backoff_base_s=0)
    store.time_offset_s = -100
    q.enqueue("s", {}, task="resize")
    store.time_offset_s = -70
    (job,) = q.claim("host:1:abcd", 1)
    store.time_offset_s = -50
    q.retry_later(job, ConnectionError("timed out"), 0)
    store.time_offset_s = -40
    (job,) = q.claim("host:2:ef01", 1)
    store.time_offset_s = -25
    q.complete(job, None)
    # When it is inspected (wide enough that no line wraps)
    story = invoke("inspect", "s", env=WIDE)
    # Then the story puts the wait on the first claim and each duration on the attempt's end
    assert story.exit_code == 0, story.output
    lines = story.output.splitlines()
    assert re.search(r"claimed .*attempt 1 .*· waited 30\.\d s$", lines[-4]), lines[-4]
    assert re.search(r"will be retried .*· attempt 1 ran 20\.\d s$", lines[-3]), lines[-3]
    assert re.search(r"finished .*· attempt 2 ran 15\.\d s$", lines[-1]), lines[-1]
    # And --json gives the same reading
    data = json.loads(invoke("inspect", "s", "--json").output)
    assert data["waited_s"] == pytest.approx(30, abs=1)
    assert [(a["attempt"], a["worker_id"], a["ended_by"]) for a in data["attempts"]] == [
        (1, "host:1:abcd", "retry_scheduled"), (2, "host:2:ef01", "result_saved")]
    assert [a["ran_s"] for a in data["attempts"]] == [pytest.approx(20, abs=1),
                                                      pytest.approx(15, abs=1)]


def test_inspect_tells_how_long_a_running_attempt_has_run(invoke: Invoke,
                                                            store: leaseq.Store) -> None:
    # Given a job claimed 95 s ago and still held
    q = store.queue("images")
    store.time_offset_s = -95
    q.enqueue("s", {}, task="resize")
    q.claim("host:1:abcd", 1, lease_s=600)
    # When it is inspected, Then its claim says how long it has been running
    story = invoke("inspect", "s", env=WIDE)
    assert story.exit_code == 0, story.output
    assert re.search(r"claimed .*· .*running for 1 min 3\d s$", story.output.splitlines()[-1])
    (attempt,) = json.loads(invoke("inspect", "s", "--json").output)["attempts"]
    assert attempt["ended_by"] is None and attempt["ran_s"] == pytest.approx(95, abs=5)


def test_inspect_unknown_job_exits_1(invoke: Invoke, store: leaseq.Store) -> None:
    store.queue("images").enqueue("a", {"path": "a"})
    result = invoke("inspect", "nope")
    assert result.exit_code == 1
    assert "no queue has a job 'nope'" in result.stderr
    assert invoke("inspect", "nope", "--queue", "images").exit_code == 1


def test_inspect_ambiguous_job_asks_for_the_queue(invoke: Invoke, store: leaseq.Store) -> None:
    store.queue("a").enqueue("same", {})
    store.queue("b").enqueue("same", {})
    result = invoke("inspect", "same")
    assert result.exit_code == 2 and "pass --queue" in result.output


def test_failed_lists_the_quarantine_with_reasons(invoke: Invoke, store: leaseq.Store) -> None:
    given_failed(store, "bad-1")
    given_failed(store, "bad-2", queue="other")
    store.queue("images").enqueue("fine", {"path": "x"})
    table = invoke("failed")
    assert table.exit_code == 0, table.output
    assert "bad-1" in table.output and "permanent" in table.output
    assert "corrupt header" in table.output and "fine" not in table.output
    rows = json.loads(invoke("failed", "--json", "--queue", "images").output)
    assert [(r["job_id"], r["failure"], r["error"]) for r in rows] == [
        ("bad-1", "permanent", "ValueError: corrupt header")]
    assert invoke("failed", "--limit", "0").exit_code == 2


# --- operators --------------------------------------------------------------------------------


def test_requeue_one_and_all_failed(invoke: Invoke, store: leaseq.Store) -> None:
    for job_id in ("f1", "f2", "f3"):
        given_failed(store, job_id)
    one = invoke("requeue", "f1")
    assert one.exit_code == 0, one.output
    assert store.get("images", "f1").status == "pending"  # type: ignore[union-attr]
    again = invoke("requeue", "f1")  # now live: nothing to requeue
    assert again.exit_code == 1 and "still pending" in again.stderr
    every = invoke("requeue", "--all-failed")
    assert every.output.strip() == "requeued 2 failed job(s)"
    assert store.counts("images") == {"pending": 3}


def test_retry_is_the_deprecated_name_of_requeue(invoke: Invoke, store: leaseq.Store) -> None:
    # Given a quarantined job, and a script that still says `leaseq retry`
    given_failed(store, "old-script")
    # When it runs
    result = invoke("retry", "old-script")
    # Then the job is requeued as by `leaseq requeue`, and the help says which name to use
    assert result.exit_code == 0, result.output
    assert store.get("images", "old-script").status == "pending"  # type: ignore[union-attr]
    assert "Deprecated: use `leaseq requeue`" in invoke("retry", "--help").output
    # And the script's log says so too, on stderr, its output left as requeue's
    assert result.stderr == "leaseq: `leaseq retry` is deprecated; use `leaseq requeue`\n"
    assert result.stdout.startswith("requeued: job old-script")


@pytest.mark.parametrize("args", [("failed", "--queue", "imags"),
                                  ("requeue", "--all-failed", "--queue", "imags")],
                         ids=" ".join)
def test_a_queue_typo_is_named_not_read_as_an_empty_quarantine(
        invoke: Invoke, store: leaseq.Store, args: tuple[str, ...]) -> None:
    given_failed(store, "f1")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert result.stderr == "no jobs in queue(s): imags (is the name right?)\n"
    assert store.get("images", "f1").status == "failed"  # type: ignore[union-attr]
    refused = invoke(args[0], *args[1:-1], "bad name")
    assert refused.exit_code == 2 and "queue name" in refused.output


@pytest.mark.parametrize("command", ["requeue", "retry"])
@pytest.mark.parametrize("args", [[], ["x", "--all-failed"]])
def test_requeue_needs_exactly_one_target(invoke: Invoke, command: str, args: list[str]) -> None:
    result = invoke(command, *args)
    assert result.exit_code == 2 and "either JOB or --all-failed" in result.output


def test_cancel(invoke: Invoke, store: leaseq.Store) -> None:
    store.queue("images").enqueue("c", {"path": "c"})
    result = invoke("cancel", "c")
    assert result.exit_code == 0, result.output
    assert store.get("images", "c").status == "cancelled"  # type: ignore[union-attr]
    again = invoke("cancel", "c")
    assert again.exit_code == 1 and "job 'c' is cancelled already" in again.output
    assert invoke("cancel", "missing").exit_code == 1
    assert invoke("cancel").exit_code == 2


# --- upkeep -----------------------------------------------------------------------------------


def test_status_printed_to_a_pipe_keeps_long_queue_names_whole(
    invoke: Invoke, store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue with a long name, and output that is not a terminal, with no $COLUMNS
    monkeypatch.delenv("COLUMNS", raising=False)
    name = "thumbnails-for-the-customer-portal-in-europe-west"
    store.queue(name).enqueue("a", {})
    # When the status is printed, Then its name and every header are whole (80 columns cut
    # them to "thumb…" and "pendi…")
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert name in result.output
    assert "pending" in result.output and "processing" in result.output


def test_sweep_once(invoke: Invoke, store: leaseq.Store) -> None:
    # Given a job whose worker died with a 1 ms lease, and a done job
    q = store.queue("images")
    q.enqueue("a", {})
    q.enqueue("b", {})
    (done,) = q.claim("w", 1)
    q.complete(done)
    q.claim("dead", 1, lease_s=0.001)
    # When the sweeper runs once, keeping done jobs for 0 s
    result = invoke("sweep", "--json", "--retain", "done=0")
    # Then the dead worker's job is ready again and the done one is purged
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [
        {"queue": "images", "reclaimed": 1, "expired": 0, "purged": 1}]
    assert invoke("sweep").output.strip() == "images: reclaimed 0, expired 0, purged 0"
    assert invoke("sweep", "--queue", "other").output.strip() == (
        "other: reclaimed 0, expired 0, purged 0")


def test_sweep_prints_the_queues_swept_before_the_one_that_failed(
        invoke: Invoke, store: leaseq.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two queues, and a store whose reclaim of the second fails
    for name in ("aa", "zz"):
        store.queue(name).enqueue("j", {})
    reclaim = type(store).reclaim_expired

    def failing(self: leaseq.Store, queue: str, *args: object, **kwargs: object) -> object:
        if queue == "zz":
            raise leaseq.StoreUnavailable("the reclaim was cut at its deadline")
        return reclaim(self, queue, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store), "reclaim_expired", failing)
    # When the sweeper runs once
    result = invoke("sweep")
    # Then it tells what it swept, then the failure, and exits 1
    assert result.exit_code == 1, result.output
    assert "aa: reclaimed 0, expired 0, purged 0" in result.output
    assert "cut at its deadline" in result.output


def test_sweep_names_a_retained_status_no_job_has(invoke: Invoke, store: leaseq.Store) -> None:
    # Given a queue with a done job
    q = store.queue("images")
    q.enqueue("a", {})
    q.complete(q.claim("w", 1)[0])
    # When the sweep is told to purge "faild" jobs (a typo), and "done" ones
    result = invoke("sweep", "--retain", "faild=0", "--retain", "done=3600")
    # Then it sweeps, and says that no job has the status "faild"
    assert result.exit_code == 0, result.output
    assert "no job has status 'faild' (is the name right?)" in result.output
    assert "'done'" not in result.output


def test_sweep_refuses_to_retain_by_a_live_status(invoke: Invoke) -> None:
    result = invoke("sweep", "--retain", "pending=0")
    assert result.exit_code == 2
    assert "'pending' is a live status: retention purges ended jobs" in result.output


@pytest.mark.parametrize("args", [["--retain", "done"], ["--retain", "pending=5"],
                                  ["--retain", "done=x"], ["--every", "0"], ["--every", "nan"]])
def test_sweep_bad_arguments_exit_2(invoke: Invoke, args: list[str]) -> None:
    result = invoke("sweep", *args)
    assert result.exit_code == 2, result.output


def test_sweep_every_runs_until_sigterm(url: str) -> None:
    process = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "sweep", "--every", "0.1",
                                "--url", url], stdout=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()  # type: ignore[union-attr]
        assert first.strip() == "no queues yet"
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()  # type: ignore[union-attr]


def test_migrate(invoke: Invoke) -> None:
    result = invoke("migrate")
    assert result.exit_code == 0 and result.output.startswith("schema version ")


# --- worker -----------------------------------------------------------------------------------


def test_worker_burst_runs_the_apps_tasks(
    invoke: Invoke, store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    store.queue("images").enqueue("w", {"path": "a.png"}, task="resize")
    result = invoke("worker", "cli_tasks:app", "--burst", "--log-level", "warning")
    assert result.exit_code == 0, result.output
    assert store.get("images", "w").result == {"path": "a.png", "width": 256}  # type: ignore[union-attr]


def test_a_worker_queue_no_task_is_declared_on_is_named_on_stderr(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    # When a worker of an app whose tasks use "images" is told to serve "imagse" and "images"
    monkeypatch.syspath_prepend(str(HERE))
    result = invoke("worker", "cli_tasks:app", "--burst", "--queue", "imagse", "--queue",
                    "images", "--log-level", "warning")
    # Then it serves them, and names the one no task is declared on
    assert result.exit_code == 0, result.output
    assert result.output.count("no task of the app") == 1
    assert ("no task of the app is declared on queue 'imagse' (its tasks' queues: images)"
            in result.output)


def app_naming_its_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``named_store_app`` whose App names its store, a SQLite file in ``tmp_path``;
    the store's URL."""
    named = f"sqlite:///{tmp_path / 'named.db'}"
    (tmp_path / "named_store_app.py").write_text(
        "import leaseq\n"
        f"app = leaseq.App({named!r})\n"
        "@app.task(queue='images')\n"
        "def resize(path: str) -> str:\n"
        "    return path\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "named_store_app", raising=False)
    return named


def test_the_worker_serves_the_store_its_app_names_whatever_leaseq_url_says(
    invoke: Invoke, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an app that names its store, a job its producer enqueued there, and $LEASEQ_URL
    # naming another store (this test's)
    named = app_naming_its_store(tmp_path, monkeypatch)
    from named_store_app import app, resize  # type: ignore[import-not-found]

    resize.enqueue(path="a.png", job_id="j")
    # When its worker runs with no --url
    result = invoke("worker", "named_store_app:app", "--burst", "--log-level", "warning")
    # Then it ran the job where the producer put it, and said that $LEASEQ_URL was not used
    assert result.exit_code == 0, result.output
    assert app.queue("images").get("j").status == "done"  # type: ignore[union-attr]
    assert f"$LEASEQ_URL ({url}) is not used" in result.output
    # And the producer through the command line (enqueue --app) writes there too
    assert invoke("enqueue", "--app", "named_store_app:app", "--task", "resize",
                  "--job-id", "k", "--payload", '{"path": "b.png"}').exit_code == 0
    assert app.queue("images").get("k") is not None
    with leaseq.connect(url) as other:
        assert other.get("images", "j") is None and other.get("images", "k") is None
    assert named in app.store.url


def test_a_url_on_the_command_line_serves_another_store_than_the_app_names(
    invoke: Invoke, store: leaseq.Store, url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an app that names its store, and a job in another store
    app_naming_its_store(tmp_path, monkeypatch)
    store.queue("images").enqueue("j", {"path": "a.png"}, task="resize")
    # When its worker runs with --url naming the other store, Then it serves that one
    result = invoke("worker", "named_store_app:app", "--burst", "--url", url,
                    "--log-level", "warning")
    assert result.exit_code == 0, result.output
    assert store.get("images", "j").status == "done"  # type: ignore[union-attr]
    assert "is not used" not in result.output


def test_a_broker_workers_prefix_names_the_topology_it_consumes(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a consumer started as the worker command starts it, with the dispatcher's prefix
    monkeypatch.syspath_prepend(str(HERE))
    from leaseq.delivery import rabbitmq

    given: dict[str, object] = {}
    monkeypatch.setattr(rabbitmq, "run_app_consumer",
                        lambda app, amqp_url, **kwargs: given.update(kwargs))
    result = invoke("worker", "cli_tasks:app", "--delivery", "rabbitmq", "--amqp-url",
                    "amqp://broker", "--prefix", "shop")
    # Then it consumes the queues named with that prefix
    assert result.exit_code == 0, result.output
    assert given["topology"].prefix == "shop"  # type: ignore[attr-defined]


def test_both_broker_consumer_commands_run_as_many_jobs_at_once_as_the_worker_by_default(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the two commands that start a RabbitMQ consumer of an app, without --concurrency
    monkeypatch.syspath_prepend(str(HERE))
    import inspect

    from leaseq.delivery import rabbitmq
    from leaseq.worker import WorkerConfig

    library = inspect.signature(rabbitmq.run_app_consumer).parameters["concurrency"].default
    given: list[object] = []
    monkeypatch.setattr(rabbitmq, "run_app_consumer",
                        lambda app, amqp_url, **kwargs: given.append(kwargs["concurrency"]))
    for args in (["worker", "cli_tasks:app", "--delivery", "rabbitmq"],
                 ["rabbitmq", "consume", "cli_tasks:app"]):
        result = invoke(*args, "--amqp-url", "amqp://broker")
        assert result.exit_code == 0, result.output
    # Then both run the polling worker's number of jobs at once, as the library call does
    default = WorkerConfig().concurrency
    assert given == [default, default] and library == default


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker"], "Missing argument 'MODULE:APP'"),
        (["worker", "no_colon"], "expected MODULE:APP"),
        (["worker", "no_such_module_xyz:app"], "cannot import module"),
        (["worker", "json:dumps"], "is not a leaseq.App"),
        (["worker", "cli_tasks:app", "--concurrency", "0"], "--concurrency"),
        (["worker", "cli_tasks:app", "--processes", "x"], "--processes"),
        (["worker", "cli_tasks:app", "--grace-s", "-1"], "--grace-s"),
        (["worker", "cli_tasks:app", "--grace-s", "nan"], "finite"),
        (["worker", "cli_tasks:app", "--burst", "--metrics-port", "65535", "--processes", "2"],
         "past 65535"),
        (["worker", "cli_tasks:app", "--burst", "--prefix", "shop"], "--delivery rabbitmq"),
        # the polling worker's own: with push delivery they had been dropped without a word
        (["worker", "cli_tasks:app", "--delivery", "rabbitmq", "--amqp-url", "amqp://b",
          "--metrics-port", "9100"], "leaseq metrics"),
        (["worker", "cli_tasks:app", "--delivery", "rabbitmq", "--amqp-url", "amqp://b",
          "--sweep-every-s", "5"], "leaseq sweep --every"),
    ],
)
def test_worker_bad_arguments_exit_2(
    invoke: Invoke, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


# --- the database cannot be used ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///no/such/folder/jobs.db",
        "nosuch://host/db",
        "sqlite://host/jobs.db",
        "postgresql://leaseq:s3cret-pw@127.0.0.1:1/leaseq?connect_timeout=2",
    ],
)
@pytest.mark.parametrize("command", [["status"], ["failed"], ["migrate"], ["sweep"],
                                     ["inspect", "x"], ["requeue", "x"], ["retry", "x"],
                                     ["cancel", "x"],
                                     ["enqueue", "--task", "t", "--payload", "{}"]])
def test_unusable_database_is_one_line_and_exit_1(
    invoke: Invoke, url: str, command: list[str]
) -> None:
    result = invoke(*command, "--url", url)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("leaseq: "), result.stderr
    assert "s3cret-pw" not in result.output
    assert "Traceback" not in result.output


def test_leaseq_url_environment_is_used(invoke: Invoke, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'other.db'}"
    invoke("enqueue", "--task", "t", "--payload", "{}", "--job-id", "e", env={"LEASEQ_URL": other})
    with leaseq.connect(other) as store:
        assert store.get("default", "e") is not None


def test_help_and_unknown_command(invoke: Invoke) -> None:
    assert invoke("--help").exit_code == 0
    for command in ("worker", "enqueue", "status", "inspect", "failed", "requeue", "retry",
                    "cancel", "sweep", "migrate", "metrics", "demo", "dispatch", "rabbitmq"):
        assert command in invoke("--help").output
        assert invoke(command, "--help").exit_code == 0
    assert invoke("nope").exit_code == 2
    assert invoke("metrics").exit_code == 2  # --port is required
    assert invoke("demo", "--jobs", "1").exit_code == 2


def test_text_that_looks_like_markup_is_printed_as_it_is(invoke: Invoke,
                                                         store: leaseq.Store) -> None:
    # Given a job whose id, task, worker and error read like rich markup (one tag closes
    # nothing, which rich refuses to print)
    q = store.queue("images")
    q.enqueue("job[/bold]", {"path": "p"}, task="resize[red]")
    (job,) = q.claim("host[/i]:1:w", 1)
    q.fail(job, ValueError("bad [/red] header [link=x]"), "permanent")
    # When the story, the quarantine and the status are printed
    story, failed, status = (invoke("inspect", "job[/bold]"), invoke("failed"),
                             invoke("status"))
    # Then each prints, with the text as it was written
    for result in (story, failed, status):
        assert result.exit_code == 0, result.output
    assert "bad [/red] header [link=x]" in story.output
    assert "by host[/i]:1:w" in story.output
    assert "story of job[/bold]" in story.output
    assert "job[/bold]" in failed.output and "resize[red]" in failed.output


def test_a_url_that_reads_like_markup_is_printed_as_it_is(invoke: Invoke,
                                                          tmp_path: Path) -> None:
    # A "[/bold]" in the path made rich refuse the whole table; a "[prod]" vanished from it
    folder = tmp_path / "[/bold][prod]"
    folder.mkdir(parents=True)
    url = f"sqlite:///{folder / 'jobs.db'}"
    with leaseq.connect(url) as store:
        store.queue("images").enqueue("a", {})
    result = invoke("status", "--url", url, env=WIDE)
    assert result.exit_code == 0, result.output
    assert "[/bold][prod]" in result.output


@pytest.mark.parametrize("command", ["inspect", "cancel", "requeue"])
def test_a_job_id_that_is_not_unicode_is_a_usage_error(invoke: Invoke, store: leaseq.Store,
                                                        command: str) -> None:
    # Without --queue the id went to every queue's store read, which raised on encoding it
    result = invoke(command, "a\udcff")
    assert result.exit_code == 2, result.output
    assert "valid Unicode" in result.output


def test_a_metrics_port_that_is_taken_is_one_line_and_exit_2(invoke: Invoke,
                                                             store: leaseq.Store) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        result = invoke("metrics", "--port", str(port), "--addr", "127.0.0.1")
    finally:
        taken.close()
    assert result.exit_code == 2, result.output
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output


def test_metrics_refuses_a_bad_queue_name_and_warns_of_an_empty_queue(
        invoke: Invoke, store: leaseq.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # A typo read as "0 ready" to an autoscaler, which scaled the workers to zero
    result = invoke("metrics", "--port", "0", "--queue", "bad name")
    assert result.exit_code == 2, result.output
    assert "queue name" in result.output

    class Served(Exception):
        pass

    def serve(*args: object, **kwargs: object) -> None:
        raise Served

    monkeypatch.setattr("leaseq.cli.ops.Metrics.serve", serve)
    store.queue("emails").enqueue("j1", {})
    result = invoke("metrics", "--port", "0", "--queue", "emails", "--queue", "emials")
    assert isinstance(result.exception, Served), result.output
    assert "no jobs in queue(s): emials (is the name right?)" in result.output


def test_text_from_the_store_cannot_drive_the_operators_terminal(
        invoke: Invoke, store: leaseq.Store) -> None:
    # Given a job failed with an error text full of terminal escapes (a retitle, a screen
    # clear, a colour), as an exception message built from outside input can be
    q = store.queue("images")
    q.enqueue("e\x1b[2J1", {}, task="resize")
    job = q.claim_one("e\x1b[2J1", "host:1:abcd", lease_s=60)
    assert job is not None
    q.fail(job, "boom \x1b]0;pwned\x07\x1b[2J\x1b[31mFAKE OK\x1b[0m")
    # When the quarantine is listed and the job inspected
    for shown in (invoke("failed"), invoke("inspect", "e\x1b[2J1")):
        # Then no control character reaches the terminal: each is written out as \xNN
        assert shown.exit_code == 0, shown.output
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown.output), repr(shown.output)
        assert r"\x1b[31mFAKE OK" in shown.output


def test_a_broker_consumer_of_an_app_with_schedules_says_it_runs_none(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an app with schedules, moved from polling workers to push delivery
    monkeypatch.syspath_prepend(str(HERE))
    from leaseq.delivery import rabbitmq

    monkeypatch.setattr(rabbitmq, "run_app_consumer", lambda app, amqp_url, **kwargs: None)
    args = ["worker", "cli_periodic:app", "--delivery", "rabbitmq", "--amqp-url", "amqp://b"]
    # When its consumer starts, Then it says its schedules tick elsewhere or not at all
    assert invoke(*args).exit_code == 0
    assert "runs no scheduler" in caplog.text and "leaseq scheduler" in caplog.text
    # And --no-scheduler, which says so on purpose, silences it
    caplog.clear()
    assert invoke(*args, "--no-scheduler").exit_code == 0
    assert "runs no scheduler" not in caplog.text
