"""Scenarios 13-15 (issue 14): a worker partitioned from its PostgreSQL while it works.

Worker A runs in a network namespace of the scenario's own, joined to the host by a veth pair;
worker B runs on the host; both use a throwaway cluster listening on the veth's host address.
Every handler checks its lease every 20 ms and stamps its start and stop on the host's
monotonic clock. The fault hits while A holds jobs:

- ``clean``: A's link goes down for 2 x lease;
- ``hole``: nftables drops every packet of A's for 2 x lease (nothing refused, nothing reset);
- ``flap``: A's link goes down and up every second (30 s full, 8 s quick).

Then B stops and a tail of jobs must be done by A alone (it reconnected by itself). Checked:
every job terminal, 0 lost, 0 stale writes accepted, no two runs of one job overlapping in
time (A abandons before B can claim), no store call longer than its bound (a beat: half its
interval; any other: ``reconnect_s + call_timeout_s``), A's heartbeat thread alive, each
abandonment before the lease ran out (its clock runs out at ``lease - margin`` after the last
confirmation) and journaled afterwards.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from leaseq.heartbeat import TICK_BOUND_S
from leaseq.job import Lease, LeaseLost
from leaseq.testing.chaos import Run, Skip, all_terminal, settle, wait_until
from leaseq.testing.chaos.cluster import Cluster
from leaseq.testing.chaos.netns import NetworkNamespace, skip_or_fail
from leaseq.testing.chaos.run import WorkerProc

#: Store bounds the workers get (their URL): a call's tries stop after RECONNECT_S, one try
#: is cut after CALL_TIMEOUT_S.
RECONNECT_S, CALL_TIMEOUT_S = 3, 3
#: Scheduling slack allowed on a busy 2-core machine over a call's bound, in wall time (a
#: thread there can wake half a second late; a call that ignored its bound blocks for the
#: fault's 2 x lease).
WALL_SLACK_S = 1.5
_ABANDON_RE = re.compile(r"lease not confirmed for ([0-9.]+) s; abandoned( before it started)?")


def clean(r: Run) -> None:
    _scenario(r, "clean")


def hole(r: Run) -> None:
    _scenario(r, "hole")


def flap(r: Run) -> None:
    _scenario(r, "flap")


@dataclass
class Net:
    r: Run
    ns: NetworkNamespace
    lease_s: float

    def fault(self, kind: str) -> float:
        """Apply the fault, hold it, lift it; returns how long it lasted."""
        started = time.monotonic()
        if kind == "flap":
            until = started + self.r.size(8, 30)
            while time.monotonic() < until:
                self.ns.link(up=False)
                time.sleep(1.0)
                self.ns.link(up=True)
                time.sleep(1.0)
            return time.monotonic() - started
        self._cut(kind, True)
        time.sleep(2 * self.lease_s)
        self._cut(kind, False)
        return time.monotonic() - started

    def _cut(self, kind: str, on: bool) -> None:
        if kind == "clean":
            self.ns.link(up=not on)
        else:
            self.ns.black_hole(on=on)


def _scenario(r: Run, kind: str) -> None:
    if r.store_kind != "postgres":
        raise Skip("a partition needs a networked store: PostgreSQL only")
    lease_s = float(r.size(3, 6))
    ns, cluster = _network(r, kind)
    bounds = {"schema": "chaos", "reconnect_s": RECONNECT_S, "call_timeout_s": CALL_TIMEOUT_S}
    q = r.open(cluster.url("127.0.0.1", **bounds)).queue("chaos")
    ledger = r.ledger()
    # Handlers longer than a lease, and few more jobs than slots: B is free to take A's jobs
    # as soon as the store lets it, so a run of A's that went on would overlap B's.
    n = r.size(8, 40)
    ids = [f"part-{k:04d}" for k in range(n)]
    q.enqueue_many([q.spec(i, {"n": k, "work_s": round(r.rng.uniform(lease_s, 2.5 * lease_s), 2)},
                           task="steady", max_attempts=20) for k, i in enumerate(ids)])
    a = _worker(r, "A", cluster.url(ns.host_ip, **bounds), lease_s, ns)
    b = _worker(r, "B", cluster.url("127.0.0.1", **bounds), lease_s, None)
    a.start()
    r.check("A started jobs before the fault",
            wait_until(lambda: q.counts().get("processing", 0) >= 4, 30, 0.05), str(q.counts()))
    b.start()
    lasted = Net(r, ns, lease_s).fault(kind)
    r.log("fault", kind=kind, seconds=round(lasted, 2))
    finished = wait_until(all_terminal(q, ids), r.size(60, 240), 0.2)
    r.check("every job terminal after the fault", finished, str(q.counts()))
    b.stop()
    tail = [f"tail-{k:03d}" for k in range(r.size(6, 20))]
    q.enqueue_many([q.spec(i, {"n": k, "work_s": 0.2}, task="steady") for k, i in
                    enumerate(tail)])
    r.check("A reconnected by itself and finished the tail alone",
            wait_until(all_terminal(q, ids + tail), 60, 0.2), str(q.counts()))
    probe_a = _probe(r, "A")
    a.stop()
    _measure(r, q, ids + tail, ledger, a, probe_a, lease_s, kind)


def _network(r: Run, kind: str) -> tuple[NetworkNamespace, Cluster]:
    """The namespace and the cluster on its veth; under ``CI=true`` not having them fails."""
    ns = NetworkNamespace.create()
    r.on_cleanup(ns.delete)
    if kind == "hole":
        ns.black_hole(on=True)  # find out now (skip) when nftables is missing
        ns.black_hole(on=False)
    try:
        cluster = Cluster.start(r, listen=("127.0.0.1", ns.host_ip),
                                trust=(f"{ns.inner_ip}/32",))
    except Skip as exc:
        raise skip_or_fail(str(exc)) from None
    return ns, cluster


def _worker(r: Run, name: str, url: str, lease_s: float,
            ns: NetworkNamespace | None) -> WorkerProc:
    env = {"CHAOS_LEASE_S": str(lease_s), "CHAOS_PROBE": os.path.join(r.folder,
                                                                        f"probe-{name}.json")}
    proc = r.worker(name, concurrency=4, url=url, env=env, sweep_every_s=0.5)
    if ns is not None:
        proc.command = [*ns.prefix(), *proc.command]
    return proc


def _probe(r: Run, name: str) -> dict[str, Any]:
    try:
        with open(os.path.join(r.folder, f"probe-{name}.json"), encoding="utf-8") as fh:
            return dict(json.load(fh))
    except (OSError, ValueError):
        return {}


def _measure(r: Run, q: Any, ids: list[str], ledger: Any, a: WorkerProc,
             probe_a: dict[str, Any], lease_s: float, kind: str) -> None:
    jobs = settle(r, q, ids, ledger, reruns_allowed=True)
    runs = ledger.facts("run")
    c = r.counts
    c.overlapping_runs = _overlaps(runs)
    r.check("no two runs of one job overlap in time", c.overlapping_runs == 0,
            f"{c.overlapping_runs} overlapping pairs")
    _stale_writes(r, q, jobs, runs, a)
    _blocked_calls(r, probe_a, lease_s)
    log = a.output()
    abandoned = _ABANDON_RE.findall(log)
    # A claim answered only after its lease clock ran out is abandoned at once, unstarted;
    # a running job must be abandoned by the time its lease clock runs out.
    silences = [float(x) for x, unstarted in abandoned if not unstarted]
    c.abandon_after_s = max(silences, default=None)
    if kind != "flap":  # a flapping link may never stay down long enough
        r.check("A abandoned the jobs it held", bool(silences), "no abandonment in A's log")
    # Abandoned once lease - margin had passed (the worker's clock, woken a little late on a
    # busy machine), and before the lease itself ran out: before B could claim the job.
    r.check("each abandonment before the lease ran out", all(s < lease_s for s in silences),
            f"longest silence {c.abandon_after_s} s ≥ the lease, {lease_s} s")
    journaled = sum(1 for i in ids for e in q.journal(i) if e.event == "lease_abandoned")
    r.check("every abandonment journaled once the store was back", journaled == len(abandoned),
            f"{journaled} journaled, {len(abandoned)} abandoned")
    tail_by_a = [i for i, v in runs if str(i).startswith("tail-") and v["pid"] == a.pid]
    r.check("A ran the tail after the fault", bool(tail_by_a), "no tail job run by A")


def _overlaps(runs: list[tuple[str | None, Any]]) -> int:
    by_job: dict[str | None, list[tuple[float, float]]] = {}
    for job_id, v in runs:
        by_job.setdefault(job_id, []).append((v["start"], v["stop"]))
    pairs = 0
    for spans in by_job.values():
        spans.sort()
        for k, (start, _) in enumerate(spans):
            pairs += sum(1 for _, stop in spans[:k] if start < stop)
    return pairs


def _stale_writes(r: Run, q: Any, jobs: dict[str, Any], runs: list[tuple[str | None, Any]],
                  a: WorkerProc) -> None:
    """Every run's lease that is not the one that finished its job, written through the API
    after the fact (heartbeat, complete), and the journal's result under such a lease."""
    old = {(job_id, v["epoch"]) for job_id, v in runs
           if job_id in jobs and v["epoch"] != jobs[job_id].lease_epoch}
    refused = accepted = 0
    for job_id, epoch in old:
        lost = q.store.heartbeat_many("chaos", [Lease(job_id, epoch)], 60)
        refused, accepted = (refused + 1, accepted) if lost else (refused, accepted + 1)
        try:
            q.store.complete("chaos", Lease(job_id, epoch), json.dumps({"by": "stale"}))
            accepted += 1
        except LeaseLost:
            refused += 1
    saved_stale = [(job_id, epoch) for job_id, epoch in old for e in q.journal(job_id)
                   if e.lease_epoch == epoch and e.event == "result_saved"]
    r.counts.stale_refused = refused + a.output().count("lease lost")
    r.counts.stale_accepted = accepted + len(saved_stale)
    r.check("0 stale writes accepted", r.counts.stale_accepted == 0,
            f"API accepted {accepted}; results saved under an old lease: {saved_stale[:3]}")


def _blocked_calls(r: Run, probe: dict[str, Any], lease_s: float) -> None:
    """Every call of the heartbeat thread was given at most its bound by its deadline (a beat:
    half the beat interval; the worker registry's tick: ``TICK_BOUND_S``), and no call outlasted
    its bound by more than a busy machine's scheduling (``WALL_SLACK_S``: the bound given is
    the guarantee; wall time only catches a call that ignored it)."""
    longest = probe.get("longest_s", {})
    r.counts.longest_blocked_s = round(max(longest.values(), default=0.0), 2)
    # the chaos tasks beat every lease / 4; a beat waits half of it
    heartbeat_bound = max(lease_s / 4 / 2, TICK_BOUND_S)
    given = probe.get("bound_s", {}).get("leaseq-heartbeat", 0.0)
    r.check("every heartbeat call bounded by its deadline", given <= heartbeat_bound,
            f"a heartbeat-thread call was given {given} s > {heartbeat_bound} s")
    other_bound = RECONNECT_S + CALL_TIMEOUT_S
    over = {k: v for k, v in longest.items()
            if v > (heartbeat_bound if k == "leaseq-heartbeat" else other_bound) + WALL_SLACK_S}
    r.check("no store call blocked past its bound", not over, str(over))
    r.check("A's heartbeat thread alive", probe.get("heartbeat_alive") is True, str(probe))
