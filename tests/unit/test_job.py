"""The job record, statuses, outcomes, effect keys, and the errors users meet."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseq.errors import InvalidInput, JobConflict, JobNotFound, LeaseqError
from leaseq.job import (
    EnqueueOutcome,
    Failure,
    Job,
    JobStatus,
    Lease,
    LeaseLost,
    Permanent,
    Retry,
    Snooze,
    is_terminal,
    safe_reason,
)
from leaseq.journal import JournalEvent

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def a_job(**fields: object) -> Job:
    values: dict[str, object] = {"id": "file:1", "queue": "thumbs", "status": "processing",
                                 "payload": {"path": "a.png"}, "attempts": 2, "lease_epoch": 7,
                                 "revision": "md5-1", "lease_until": NOW}
    values.update(fields)
    return Job(**values)  # type: ignore[arg-type]


def test_statuses_and_terminality() -> None:
    assert [s.value for s in JobStatus] == ["pending", "processing", "done", "failed",
                                            "cancelled"]
    assert not is_terminal("pending") and not is_terminal("processing")
    assert all(is_terminal(s) for s in ("done", "failed", "cancelled", "skipped_too_large"))


def test_failure_kinds_and_outcomes() -> None:
    assert {f.value for f in Failure} == {"permanent", "exhausted", "expired", "invalid"}
    assert {o.value for o in EnqueueOutcome} == {"created", "unchanged", "updated", "revived",
                                                 "conflict"}
    assert EnqueueOutcome.CREATED == "created"  # StrEnum: compares with the stored text


def test_journal_events_are_the_designed_ones() -> None:
    for event in ("enqueued", "claimed", "heartbeat_lost", "result_saved", "retry_scheduled",
                  "snoozed", "given_back", "quarantined", "reclaimed", "requeued", "cancelled",
                  "published", "ack_sent"):
        assert event in set(JournalEvent)


def test_lease_and_attempt_come_from_the_record() -> None:
    job = a_job()
    assert job.lease == Lease("file:1", 7)
    assert job.attempt == 2


def test_lease_lost_flag_is_not_part_of_equality() -> None:
    assert a_job(lease_lost=True) == a_job()


def test_effect_key_is_stable_across_attempts_and_claims() -> None:
    first = a_job(attempts=1, lease_epoch=1, worker_id="a:1:x")
    later = a_job(attempts=4, lease_epoch=9, worker_id="b:2:y", status="pending")
    assert first.effect_key("charge") == later.effect_key("charge")
    assert first.effect_key("charge").startswith("lq-")


@pytest.mark.parametrize("change", [{"revision": "md5-2"}, {"revision": None}, {"id": "file:2"},
                                    {"queue": "other"}])
def test_effect_key_changes_with_revision_id_or_queue(change: dict[str, object]) -> None:
    assert a_job(**change).effect_key("charge") != a_job().effect_key("charge")


def test_effect_key_differs_per_effect_name() -> None:
    assert a_job().effect_key("charge") != a_job().effect_key("email")


@given(st.text(), st.text())
def test_effect_key_has_a_fixed_shape_for_any_input(job_id: str, name: str) -> None:
    key = a_job(id=job_id).effect_key(name)
    assert len(key) == 43 and key.startswith("lq-")


def test_to_dict_is_json_ready() -> None:
    out = a_job(lease_lost=True).to_dict()
    assert "lease_lost" not in out
    assert out["lease_until"] == NOW.isoformat()
    assert json.loads(json.dumps(out))["payload"] == {"path": "a.png"}


def test_outcome_exceptions_carry_their_values_and_refuse_a_bad_delay() -> None:
    assert Retry().delay_s is None
    assert Retry("later", delay_s=5).delay_s == 5
    assert Permanent("bad file").reason == "bad file"
    snooze = Snooze(30)
    assert (snooze.delay_s, str(snooze)) == (30, "snoozed")
    assert Snooze().delay_s is None  # the policy's snooze_s
    assert Snooze(0).delay_s == 0  # an explicit 0 stays allowed
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(InvalidInput, match="delay_s"):
            Retry(delay_s=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="delay_s"):
            Snooze(bad)  # type: ignore[arg-type]


def test_safe_reason_is_type_and_last_500_characters() -> None:
    error = ValueError("HEAD" + "x" * 1000 + "TAIL")
    reason = safe_reason(error)
    assert reason.startswith("ValueError: ") and reason.endswith("TAIL")
    assert "HEAD" not in reason and len(reason) == len("ValueError: ") + 500
    assert safe_reason(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert safe_reason("y" * 600) == "y" * 500


def test_lease_lost_names_the_job_and_is_a_leaseq_error() -> None:
    error = LeaseLost("thumbs", "x" * 1000, 3)
    assert isinstance(error, LeaseqError)
    assert (error.queue, error.lease_epoch) == ("thumbs", 3)
    assert "epoch 3" in str(error) and len(str(error)) < 400


def test_job_conflict_names_at_most_five_ids_and_says_what_to_do() -> None:
    error = JobConflict("thumbs", [f"id-{i}" for i in range(8)])
    text = str(error)
    assert "'id-4'" in text and "'id-5'" not in text and "and 3 more" in text
    assert "on_conflict" in text and "revision" in text
    assert error.job_ids == [f"id-{i}" for i in range(8)]


def test_job_not_found_is_a_lookup_error() -> None:
    error = JobNotFound("thumbs", "file:9")
    assert isinstance(error, LookupError) and "file:9" in str(error)


def test_a_spec_carries_each_argument_in_its_own_field(tmp_path: Path) -> None:
    # Queue.spec builds JobSpec by position (a producer's hot path): each value must land in
    # the field of its name, whatever order JobSpec's fields take.
    from leaseq.stores import connect

    with connect(f"sqlite:///{tmp_path / 'spec.db'}") as store:
        spec = store.queue("q").spec("id-1", {"k": "v"}, task="t", revision="r", delay_s=2,
                                     max_attempts=3, priority=4, concurrency_key="c")
    assert (spec.job_id, spec.payload, spec.payload_json, spec.task, spec.revision,
            spec.delay_s, spec.max_attempts, spec.priority, spec.concurrency_key) == (
        "id-1", {"k": "v"}, '{"k":"v"}', "t", "r", 2.0, 3, 4, "c")
