"""``MongoStore.reowe_publish`` against the recording fake (see mongo_fakes.py); its semantics
on a real server are in the conformance suite (OutboxReoweSuite)."""

from __future__ import annotations

from mongo_fakes import FakeDB, Updated

from leaseq.stores.mongodb import MongoStore, documents

Q = "leaseq_q"


def test_reowe_publish_unpublishes_the_pending_published_and_journals_them() -> None:
    # Given one of two ids still pending with a publish marked
    db = FakeDB()
    store = MongoStore(db, url="mongodb://db.example/leaseq")
    db[Q].answer("find", [{"_id": "a", "status": "pending", "attempts": 1, "lease_epoch": 2}])
    db[Q].answer("update_many", Updated(1))
    # When its publish is owed again
    changed = store.reowe_publish("q", ["a", "b"], reason="dead-lettered")
    # Then that one is unpublished by the builders' documents and journaled with the reason
    assert changed == ["a"]
    query, update = db.of(Q, "update_many")[0][0]
    assert query == {**documents.published(["a", "b"]), "_id": {"$in": ["a"]}}
    assert update == documents.stamped(documents.unpublish(),
                                       update[-1]["$set"]["moved_by"]["$literal"])
    (ops,) = [args[0] for args, _ in db.of("leaseq_journal", "bulk_write")]
    fields = ops[0]._doc[0]["$set"]
    assert fields["event"]["$literal"] == "publish_owed"
    assert fields["reason"]["$literal"] == "dead-lettered"
    # and nothing given is nothing sent
    assert store.reowe_publish("q", []) == []


def test_published_selects_pending_jobs_with_a_publish_date() -> None:
    assert documents.published(("a",)) == {"_id": {"$in": ["a"]}, "status": "pending",
                                   "published_at": {"$type": "date"}}
