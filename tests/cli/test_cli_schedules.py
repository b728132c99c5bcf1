"""``leaseq schedules`` (list, trigger, pause, resume, ``--json`` on each) and ``leaseq
scheduler``'s refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import leaseq
from leaseq.ledger import format_tick
from leaseq.scheduler import Scheduler, SchedulerConfig
from leaseq.testing.harness import advance, seconds_until


def _registered(url: str) -> None:
    app = leaseq.App(url)

    @app.task(queue="reports")
    def nightly(region: str) -> None:
        """A report."""

    app.schedule("nightly", nightly, cron="0 3 * * *", timezone="Europe/Kyiv",
                  payload={"region": "zz-secret"}, overlap="skip")
    Scheduler(app).register()
    app.store.close()


def test_schedules_lists_the_ledger_with_its_next_tick(invoke, url) -> None:
    _registered(url)
    result = invoke("schedules", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["schedules"]
    assert (row["name"], row["spec"], row["timezone"], row["paused"]) == (
        "nightly", "cron 0 3 * * *", "Europe/Kyiv", False)
    assert row["next_tick"].endswith(("T00:00:00Z", "T01:00:00Z"))  # 03:00 in Kyiv
    assert "zz-secret" not in result.output  # the payload is not shown
    table = invoke("schedules")
    assert table.exit_code == 0 and "nightly" in table.output


def test_schedules_shows_the_last_tick_and_its_jobs_status_done_then_purged(
    invoke, store
) -> None:
    # Given an hourly schedule registered at half past an hour H on the store's clock (ahead
    # of the command's), whose tick H+1 ran to done
    hour = store.server_now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    advance(store, seconds_until(store, hour) + 1800)
    app = leaseq.App(store=store)

    @app.periodic(every_s=3600, queue="reports")
    def hourly() -> None:
        """A report."""

    scheduler = Scheduler(app, SchedulerConfig(jitter_s=0))
    scheduler.register()
    advance(store, 3600)
    scheduler.run_once()
    tick = hour + timedelta(hours=1)
    job_id = app.schedules["hourly"].job_id(tick)
    q = store.queue("reports")
    (job,) = q.claim("w1", lease_s=60)
    assert job.id == job_id
    q.complete(job, None)
    # When the schedules are listed
    (row,) = json.loads(invoke("schedules", "--json").output)["schedules"]
    table = invoke("schedules", env={"COLUMNS": "200"}).output
    # Then the last tick, its job and the job's status are shown, and the next tick after it
    assert (row["last_tick"], row["last_job"], row["last_job_status"]) == (
        format_tick(tick), job_id, "done")
    assert row["next_tick"] == format_tick(tick + timedelta(hours=1))
    assert format_tick(tick) in table and f"{job_id} (done)" in table
    # And once retention has purged the job, the ledger still names it, as purged
    advance(store, 1)
    assert q.purge(done=0) == 1
    (row,) = json.loads(invoke("schedules", "--json").output)["schedules"]
    assert (row["last_tick"], row["last_job"], row["last_job_status"]) == (
        format_tick(tick), job_id, None)
    assert f"{job_id} (purged)" in invoke("schedules", env={"COLUMNS": "200"}).output


def test_trigger_pause_and_resume_answer_in_json_after_the_subcommand(invoke, url, store):
    _registered(url)
    triggered = json.loads(invoke("schedules", "trigger", "nightly", "--json").output)
    assert triggered["job"].startswith("nightly@manual-")
    assert store.get("reports", triggered["job"]).payload == {"region": "zz-secret"}
    assert json.loads(invoke("schedules", "pause", "nightly", "--json").output)["changed"]
    again = invoke("schedules", "pause", "nightly")
    assert again.exit_code == 0 and "already paused" in again.output
    assert "resumed" in invoke("schedules", "resume", "nightly").output
    story = invoke("schedules", "history", "nightly")
    assert story.exit_code == 0
    for event in ("schedule_registered", "tick_manual", "schedule_paused", "schedule_resumed"):
        assert event in story.output
    journal = json.loads(invoke("schedules", "history", "nightly", "--json").output)["journal"]
    assert [e["event"] for e in journal][-1] == "schedule_resumed"
    assert invoke("schedules", "history", "nope").exit_code == 1


def test_history_keeps_the_entries_of_the_queue_a_schedule_moved_from(invoke, store) -> None:
    # Given a schedule registered in queue "reports", then moved by its code to "mail"
    for queue in ("reports", "mail"):
        app = leaseq.App(store=store)
        app.task(lambda: None, name="report", queue=queue)
        app.task(lambda: None, name="other", queue="mail" if queue == "reports" else "reports")
        app.schedule("moving", "report", every_s=3600)
        Scheduler(app).register()
        advance(store, 60)
    # When its history is asked for
    journal = json.loads(invoke("schedules", "history", "moving", "--json").output)["journal"]
    # Then the registration in the old queue is there, before the move
    assert [e["event"] for e in journal] == ["schedule_registered", "schedule_changed"]


def test_history_in_text_shows_full_utc_times_and_the_changed_fields(invoke, store) -> None:
    # Given a schedule registered, retired, and 43 days later declared again with another
    # payload
    def register(region: str) -> None:
        app = leaseq.App(store=store)
        app.task(lambda region: None, name="report", queue="reports")
        app.schedule("nightly", "report", every_s=3600, payload={"region": region})
        Scheduler(app).register()

    register("eu")
    store.deactivate_schedules(["reports"], [])
    advance(store, 43 * 86400)
    register("us")
    # When its history is shown as text
    story = invoke("schedules", "history", "nightly", env={"COLUMNS": "200"}).output
    # Then each line has the entry's UTC date and time, and the change names its fields
    journal = json.loads(invoke("schedules", "history", "nightly", "--json").output)["journal"]
    lines = story.strip().splitlines()
    assert len(lines) == len(journal) == 3
    for line, entry in zip(lines, journal, strict=True):
        at = datetime.fromisoformat(entry["at"]).astimezone(UTC)
        assert line.startswith(f"{at:%Y-%m-%d %H:%M:%S}.{at.microsecond // 1000:03d}Z")
    assert "changed: payload" in lines[2] and "reactivated" in lines[2]
    assert "+" not in story  # no offset from the first entry


def test_a_paused_or_inactive_schedule_shows_no_next_tick(invoke, url, store) -> None:
    # Given a registered schedule, listed with its next tick
    _registered(url)
    (row,) = json.loads(invoke("schedules", "--json").output)["schedules"]
    assert row["next_tick"] is not None
    for step in ("pause", "retire"):
        # When it is paused (then also retired by code without it)
        if step == "pause":
            invoke("schedules", "pause", "nightly")
        else:
            store.deactivate_schedules(["reports"], [])
        # Then no next tick is shown: none will fire
        (row,) = json.loads(invoke("schedules", "--json").output)["schedules"]
        assert row["next_tick"] is None
        table = invoke("schedules", env={"COLUMNS": "200"}).output
        (line,) = [t for t in table.splitlines() if "nightly" in t]
        assert line.split("│")[3].strip() == "-"


def test_an_unknown_schedule_exits_1(invoke, store) -> None:
    result = invoke("schedules", "trigger", "nope")
    assert result.exit_code == 1 and "no schedule named 'nope'" in result.output


def test_an_empty_ledger_says_so(invoke, store) -> None:
    assert "no schedules" in invoke("schedules").output


def test_scheduler_refuses_an_app_without_schedules(invoke) -> None:
    result = invoke("scheduler", "cli_tasks:app")
    assert result.exit_code == 2 and "declares no schedules" in result.output


def test_scheduler_of_an_app_whose_last_schedule_was_removed_retires_it_then_refuses(
    invoke, store
) -> None:
    # Given a schedule in cli_tasks' queue "images" that its previous code declared
    store.register_schedule("thumbnails", "images", '{"task":"resize","every_s":3600}')
    # When `leaseq scheduler` of the code without it starts
    result = invoke("scheduler", "cli_tasks:app")
    # Then it refuses to run, and the schedule is marked inactive first
    assert result.exit_code == 2 and "marked inactive" in result.output
    state = store.schedule_state("thumbnails")
    assert state is not None and not state.active


def test_a_record_the_code_refuses_is_listed_with_what_is_known(invoke, store) -> None:
    # Given a record an older version accepted: every_s beyond this code's 100 years
    store.register_schedule("aeons", "default", '{"task":"t","every_s":1e12}')
    # Then the list shows it, its spec unknown, instead of a traceback
    result = invoke("schedules", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["schedules"]
    assert (row["name"], row["spec"], row["next_tick"]) == ("aeons", "?", None)
