"""The schedule ledger of ``MongoStore`` against the recording fake (see mongo_fakes.py): the
compare-and-set, the intent that stands in for a transaction, and the crash between the two
writes. Its semantics on a real server are in the conformance suite (ScheduleSuite)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mongo_fakes import FakeDB
from pipeline_model import run
from pymongo.errors import DuplicateKeyError

from leaseq.errors import InvalidPayload, ScheduleConflict, StoreUnavailable
from leaseq.job import JobSpec
from leaseq.ledger import REVIVE_GRACE_S, TickAdvance
from leaseq.stores.mongodb import MongoStore

LEDGER = "leaseq__schedules"
JOURNAL = "leaseq_journal"
Q = "leaseq_q"
AT = datetime(2024, 1, 2, 3, 0, tzinfo=UTC)
TICK = AT + timedelta(hours=1)
SPEC = JobSpec("hourly@2024-01-02T04:00:00Z", {"a": 1}, '{"a":1}', task="t", max_attempts=3)


def doc(**fields: Any) -> dict[str, Any]:
    return {"_id": "hourly", "queue": "q", "spec": '{"every_s":3600}', "cursor": AT,
            "version": 4, "skipped": 0, "paused": False, "active": True, **fields}


def intent(version: int = 5) -> dict[str, Any]:
    return {"version": version, "jobs": [{"tick": TICK, "id": SPEC.job_id, "task": "t",
                                          "payload": '{"a":1}', "max_attempts": 3}]}


def journaled(db: FakeDB) -> list[tuple[str, Any, Any]]:
    out = []
    for args, _ in db.of(JOURNAL, "bulk_write"):
        for op in args[0]:
            fields = op._doc[0]["$set"]
            out.append((fields["event"]["$literal"], fields["job_id"]["$literal"],
                        fields.get("data", {}).get("$literal")))
    return out


@pytest.fixture
def store(db: FakeDB) -> MongoStore:
    return MongoStore(db, url="mongodb://db.example/leaseq")


def test_a_new_schedule_is_inserted_with_the_server_clock_and_journaled(store, db) -> None:
    # Given no document yet (the upsert's pre-image is None)
    db[LEDGER].answer("find_one_and_update", None).answer("find_one", doc(version=0))
    # When it is registered
    state = store.register_schedule("hourly", "q", '{"every_s":3600}')
    # Then every field is kept if present, else set, the cursor from $$NOW
    (args, kwargs), = db.of(LEDGER, "find_one_and_update")
    assert args[0] == {"_id": "hourly"} and kwargs["upsert"] is True
    cursor = args[1][0]["$set"]["cursor"]["$ifNull"]
    assert cursor[0] == "$cursor" and cursor[1]["$dateAdd"]["startDate"] == "$$NOW"
    assert state.version == 0
    assert journaled(db) == [("schedule_registered", "schedule:hourly", None)]


def test_a_changed_spec_is_compare_and_set_and_journaled_by_field(store, db) -> None:
    # Given the stored spec differs
    db[LEDGER].answer("find_one_and_update", doc(), doc(version=5)).answer("find_one", doc())
    # When the code registers its spec
    store.register_schedule("hourly", "q", '{"every_s":60}')
    # Then the change is guarded by the version read, and names the field, not its value
    (_, second) = db.of(LEDGER, "find_one_and_update")
    assert second[0][0] == {"_id": "hourly", "version": 4}
    assert journaled(db) == [("schedule_changed", "schedule:hourly",
                              {"changed": ["every_s"], "reactivated": False})]


def test_a_reactivation_moves_the_cursor_to_now_and_a_change_keeps_it(store, db) -> None:
    # Given an inactive record
    db[LEDGER].answer("find_one_and_update", doc(active=False), doc(version=5))
    db[LEDGER].answer("find_one", doc())
    # When the code declares it again
    store.register_schedule("hourly", "q", '{"every_s":3600}')
    # Then the cursor is the later of itself and the server's now when it was inactive
    # longer than REVIVE_GRACE_S (a shorter absence, a rolling deploy's, keeps it)
    (_, change) = db.of(LEDGER, "find_one_and_update")
    gone_long, moved, kept = change[0][1][0]["$set"]["cursor"]["$cond"]
    inactive, before = gone_long["$and"]
    assert inactive == {"$not": ["$active"]} and before["$lt"][0] == "$updated_at"
    assert before["$lt"][1]["$dateAdd"]["amount"] == -REVIVE_GRACE_S * 1000
    assert (moved["$max"][0], kept) == ("$cursor", "$cursor")
    assert moved["$max"][1]["$dateAdd"]["startDate"] == "$$NOW"
    assert journaled(db) == [("schedule_changed", "schedule:hourly",
                              {"changed": [], "reactivated": True})]


def test_a_record_active_in_another_apps_queue_is_refused_and_left_alone(store, db) -> None:
    # Given the name active in queue "billing", which the registrar does not use
    db[LEDGER].answer("find_one_and_update", doc(queue="billing"))
    db[LEDGER].answer("find_one", doc(queue="billing"))
    # When it registers the name in its queue "mail"
    with pytest.raises(ScheduleConflict, match=r"'billing'.*schedule_name"):
        store.register_schedule("hourly", "mail", '{"every_s":60}', ["mail", "other"])
    # Then only the insert-if-absent was tried: the record is not changed, nor journaled
    assert len(db.of(LEDGER, "find_one_and_update")) == 1 and journaled(db) == []


def test_a_record_of_another_queue_of_the_registrar_moves(store, db) -> None:
    db[LEDGER].answer("find_one_and_update", doc(queue="billing"), doc(queue="mail"))
    db[LEDGER].answer("find_one", doc(queue="mail"))
    assert store.register_schedule("hourly", "mail", '{"every_s":3600}',
                                   ["billing"]).queue == "mail"
    assert journaled(db) == [("schedule_changed", "schedule:hourly",
                              {"changed": ["queue"], "reactivated": False,
                               "from_queue": "billing"})]


def test_a_manual_tick_records_its_job_then_writes_it_then_journals(store, db) -> None:
    # Given the record in queue "q"
    db[LEDGER].answer("find_one_and_update", doc(last_job_id=SPEC.job_id))
    # When a manual tick is written
    assert store.trigger_schedule("hourly", "q", SPEC) is True
    # Then the record was matched in its queue and names the job as its last
    ((args, _),) = db.of(LEDGER, "find_one_and_update")
    assert args[0] == {"_id": "hourly", "queue": "q"}
    assert args[1][0]["$set"]["last_job_id"] == {"$literal": SPEC.job_id}
    assert [a[0] for a, _ in db.of(Q, "find_one_and_update")] == [{"_id": SPEC.job_id}]
    assert journaled(db) == [("enqueued", SPEC.job_id, None),
                             ("tick_manual", "schedule:hourly", {"job": SPEC.job_id})]


@pytest.mark.parametrize("active", [True, False])
def test_an_operator_action_keeps_a_retired_records_retirement_time(store, db,
                                                                    active: bool) -> None:
    # Given a record retired (or last changed) ten hours ago
    retired = AT - timedelta(hours=10)
    db[LEDGER].answer("find_one_and_update", doc(active=active), doc(active=active))
    # When an operator triggers it, then pauses it
    store.trigger_schedule("hourly", "q", SPEC)
    store.pause_schedule("hourly", True)
    # Then the update pipelines move updated_at only on an active record: an inactive one's
    # is the moment it was retired, which the reactivation's grace reads
    for args, _ in db.of(LEDGER, "find_one_and_update"):
        after = run(args[1], doc(active=active, updated_at=retired), AT)
        assert after["updated_at"] == (AT if active else retired)
        assert after["version"] == 5


def test_the_same_spec_writes_nothing_more_and_a_lost_change_logs_nothing(store, db) -> None:
    # Given one registration with the same spec, one whose change lost to another registrar
    db[LEDGER].answer("find_one_and_update", doc(), doc(active=False), None)
    db[LEDGER].answer("find_one", doc(), doc())
    store.register_schedule("hourly", "q", '{"every_s":3600}')
    store.register_schedule("hourly", "q", '{"every_s":3600}')
    # Then nothing was journaled
    assert len(db.of(LEDGER, "find_one_and_update")) == 3
    assert journaled(db) == []


def test_a_concurrent_insert_is_tried_once_more(store, db) -> None:
    db[LEDGER].answer("find_one_and_update", DuplicateKeyError("dup"), doc())
    db[LEDGER].answer("find_one", doc())
    assert store.register_schedule("hourly", "q", '{"every_s":3600}').version == 4
    db[LEDGER].answer("find_one_and_update", DuplicateKeyError("a"), DuplicateKeyError("b"))
    with pytest.raises(DuplicateKeyError):
        store.register_schedule("hourly", "q", '{"every_s":3600}')


def test_advance_sets_the_intent_with_the_cursor_then_writes_the_jobs_then_clears(
        store, db) -> None:
    # Given the compare-and-set succeeds
    db[LEDGER].answer("find_one_and_update", doc(version=5, intent=intent()), doc(version=5))
    advance = TickAdvance(TICK, jobs=[(TICK, SPEC)], missed=2, missed_first=AT,
                          missed_last=AT + timedelta(minutes=30))
    # When the advance is written
    assert store.advance_schedule("hourly", 4, advance) is True
    # Then one write moved the cursor and recorded the intent, guarded by version and state
    cas, clear = db.of(LEDGER, "find_one_and_update")
    assert cas[0][0] == {"_id": "hourly", "version": 4, "paused": False, "active": True,
                         "cursor": {"$lt": TICK}}
    fields = cas[0][1][0]["$set"]
    assert fields["intent"]["$literal"]["version"] == 5
    assert fields["last_job_id"]["$ifNull"][0] == {"$literal": SPEC.job_id}
    # and the job was upserted by its id, and then the intent of that version cleared
    assert [a[0] for a, _ in db.of(Q, "find_one_and_update")] == [{"_id": SPEC.job_id}]
    assert clear[0] == ({"_id": "hourly", "intent.version": 5}, {"$unset": {"intent": ""}})
    assert [e[0] for e in journaled(db)] == ["ticks_missed", "enqueued"]
    assert db.sequence(LEDGER).index("find_one_and_update") == 0


def test_a_lost_compare_and_set_writes_nothing(store, db) -> None:
    db[LEDGER].answer("find_one_and_update", None)
    assert store.advance_schedule("hourly", 4, TickAdvance(TICK, jobs=[(TICK, SPEC)])) is False
    assert db.of(Q, "find_one_and_update") == [] and journaled(db) == []


def test_a_crash_after_the_cas_leaves_the_intent_and_the_next_reader_writes_it(
        store, db) -> None:
    # Given the job write fails right after the compare-and-set (the process dies there)
    db[LEDGER].answer("find_one_and_update", doc(version=5, intent=intent()))
    db[Q].answer("find_one_and_update", StoreUnavailable("gone"))
    with pytest.raises(StoreUnavailable):
        store.advance_schedule("hourly", 4, TickAdvance(TICK, jobs=[(TICK, SPEC)]))
    assert db.of(LEDGER, "find_one_and_update")[1:] == []  # the intent stays
    # When any scheduler reads the record before it plans
    db[LEDGER].answer("find_one", doc(version=5, intent=intent()))
    db[LEDGER].answer("find_one_and_update", doc(version=5))
    state = store.schedule_state("hourly")
    # Then the promised job is written (idempotent by id) and the intent cleared
    assert state is not None and state.intent == () and state.version == 5
    assert [a[0] for a, _ in db.of(Q, "find_one_and_update")][-1] == {"_id": SPEC.job_id}
    assert db.of(LEDGER, "find_one_and_update")[-1][0][1] == {"$unset": {"intent": ""}}


def unstorable(payload: dict[str, Any]) -> JobSpec:
    return JobSpec(SPEC.job_id, payload, json.dumps(payload), task="t", max_attempts=3)


#: A tick's job MongoDB cannot store: an integer wider than BSON's, a document over 16 MiB
#: (its upsert carries the payload in each branch of the pipeline).
UNSTORABLE = [unstorable({"n": 2**70}), unstorable({"s": "x" * (5 * 1024 * 1024)})]


@pytest.mark.parametrize("spec", UNSTORABLE, ids=["wide-integer", "too-large"])
def test_an_advance_whose_tick_cannot_be_stored_is_refused_before_the_cas(
        store, db, spec) -> None:
    # Given a planned tick whose job MongoDB cannot store
    # When the advance is written, Then it is refused before the compare-and-set: no intent
    # is left that no reader could ever settle, and the cursor has not moved
    with pytest.raises(InvalidPayload):
        store.advance_schedule("hourly", 4, TickAdvance(TICK, jobs=[(TICK, spec)]))
    assert db.of(LEDGER, "find_one_and_update") == [] and journaled(db) == []


@pytest.mark.parametrize("spec", UNSTORABLE, ids=["wide-integer", "too-large"])
def test_a_manual_tick_that_cannot_be_stored_is_refused_before_the_record(
        store, db, spec) -> None:
    # When an operator triggers a job MongoDB cannot store, Then nothing is written: not
    # the record's last job either
    with pytest.raises(InvalidPayload):
        store.trigger_schedule("hourly", "q", spec)
    assert db.of(LEDGER, "find_one_and_update") == [] and db.of(Q, "find_one_and_update") == []


def test_an_intent_whose_job_cannot_be_stored_is_settled_without_it(store, db) -> None:
    # Given an intent left by older code: a good tick and one whose payload BSON cannot hold
    bad = {"tick": AT, "id": "hourly@bad", "task": "t", "payload": json.dumps({"n": 2**70}),
           "max_attempts": 3}
    stuck = {"version": 5, "jobs": [bad, *intent()["jobs"]]}
    db[LEDGER].answer("find_one", doc(version=5, intent=stuck))
    db[LEDGER].answer("find_one_and_update", doc(version=5))
    # When a scheduler reads the record
    state = store.schedule_state("hourly")
    # Then the good tick's job is written, the bad one journalled as missed with why, and
    # the intent cleared: the schedule goes on (every read raised InvalidPayload before)
    assert state is not None and state.intent == ()
    assert [a[0] for a, _ in db.of(Q, "find_one_and_update")] == [{"_id": SPEC.job_id}]
    assert db.of(LEDGER, "find_one_and_update")[-1][0][1] == {"$unset": {"intent": ""}}
    assert [e[:2] for e in journaled(db)] == [("ticks_missed", "schedule:hourly"),
                                               ("enqueued", SPEC.job_id)]
    assert journaled(db)[0][2] == {"count": 1, "first": "2024-01-02T03:00:00Z",
                                    "last": "2024-01-02T03:00:00Z", "job": "hourly@bad"}


def test_an_intent_cleared_by_another_reader_is_shown_without_it(store, db) -> None:
    db[LEDGER].answer("find_one", doc(version=5, intent=intent()))
    db[LEDGER].answer("find_one_and_update", None)
    state = store.schedule_state("hourly")
    assert state is not None and state.intent == ()


def test_ledger_records_carry_an_unsettled_intent_when_listed(store, db) -> None:
    db[LEDGER].answer("find", [doc(version=5, intent=intent(), last_tick=AT,
                                   last_job_id="x")])
    (state,) = store.schedules()
    assert state.intent == ((TICK, SPEC),) and state.last_tick == AT
    assert db.of(LEDGER, "find")[0][1]["sort"] == [("_id", 1)]


def test_resume_moves_the_cursor_to_the_server_clock_and_pause_twice_is_false(
        store, db) -> None:
    db[LEDGER].answer("find_one_and_update", doc(paused=False), None)
    assert store.pause_schedule("hourly", False) is True
    (query, update), _ = db.of(LEDGER, "find_one_and_update")[0]
    assert query == {"_id": "hourly", "paused": True}
    assert update[0]["$set"]["cursor"]["$max"][0] == "$cursor"
    assert store.pause_schedule("hourly", True) is False
    assert [e[0] for e in journaled(db)] == ["schedule_resumed"]


def test_deactivate_marks_only_active_schedules_of_the_queues_not_kept(store, db) -> None:
    db[LEDGER].answer("find", [doc(_id="gone"), doc(_id="kept"), doc(_id="other", queue="x"),
                               doc(_id="idle", active=False), doc(_id="raced")])
    db[LEDGER].answer("find_one_and_update", doc(_id="gone"), None)
    assert store.deactivate_schedules(["q"], ["kept"]) == ["gone"]
    guarded = [a[0] for a, _ in db.of(LEDGER, "find_one_and_update")]
    assert guarded == [{"_id": "gone", "version": 4}, {"_id": "raced", "version": 4}]
    assert journaled(db) == [("schedule_inactive", "schedule:gone", None)]


def test_intent_jobs_round_trip_their_spec() -> None:
    from leaseq.stores.mongodb.ledger import _intent_job, _spec

    job = json.loads(json.dumps(_intent_job(TICK, SPEC), default=str))
    assert _spec(job) == SPEC
