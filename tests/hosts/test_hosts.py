"""Across hosts, broken on purpose: the ledger, the Prefect server, the workers, the mail and the
model on separate network hosts (tests/hosts/cluster.py), with partitions, host loss and skewed
clocks; the checker (tests/hosts/checker.py) reads the end state after each scenario.

`make test` runs scenarios 1 and 6 with a few subjects each (about three minutes, on the xdist
worker of the ``hosts`` group); RUNLEDGER_FULL=1 (`make drills`) runs all six at full size;
scenario 4 needs Debian's faketime. Every scenario has a job of its own, so that the checker of
one is not disturbed by the others on the shared cluster. The drills need root: without it they
are skipped, and fail with RUNLEDGER_REQUIRE_POSTGRES=1 (CI)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.schemas.objects import FlowRun

from flows.run_job.outcomes import outcome_name
from store import Ledger
from tests.hosts import netns
from tests.hosts.checker import Summary, check, sink_copies
from tests.hosts.cluster import (
    DELIVER,
    PG_PORT,
    RECONCILE,
    RUN_JOB,
    WORKERS,
    Cluster,
    cluster,
)
from tests.hosts.jobs import recipient
from tests.hosts.product import PROJECT_ROOT, message_id_for
from tests.support.waiting import wait_until

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
PERIOD = "2026-03-01"
LEASE = 6.0
# job -> (subjects, seconds the model takes per call)
PARTITION_DB = "hosts-partition-db"
PARTITION_API = "hosts-partition-api"
LOSE = "hosts-lose"
SKEW = "hosts-skew"
SLOW = "hosts-slow"
MAIL = "hosts-mail"
JOBS = {
    PARTITION_DB: (24 if FULL else 6, 4.0),
    PARTITION_API: (12 if FULL else 4, 3.0),
    LOSE: (24 if FULL else 6, 3.0),
    # Model calls long enough for the overlapping tick's flow run to start while the leases are
    # held (24 subjects: three waves of 8).
    SKEW: (24 if FULL else 6, 30.0 if FULL else 60.0),
    SLOW: (200 if FULL else 20, 0.0),
    MAIL: (10 if FULL else 4, 0.0),
}
# The mail host holds these messages' DATA reply for 20 s, once each: the drill cuts the link
# meanwhile, after the sink has the message and before the dispatcher hears of it.
HELD = (("s0000", "s0001", "s0002") if FULL else ("s0000",))
MAIL_FAULTS = tuple(f"data:slow=20:1@{recipient(MAIL, s)}" for s in HELD)
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SUMMARIES: list[Summary] = []
FULL_ONLY = pytest.mark.skipif(not FULL, reason="at full size only (RUNLEDGER_FULL=1, make drills)")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Cluster]:
    with cluster(JOBS, MAIL_FAULTS, {"RUNLEDGER_LEASE_SECONDS": str(LEASE)}) as made:
        yield made
    print("\n".join(s.line() for s in SUMMARIES), flush=True)


# --- steps ------------------------------------------------------------------------------------

def tick(hosts: Cluster, job: str, on: str, env: dict[str, str] | None = None,
         period: str = PERIOD) -> UUID:
    return hosts.run(RUN_JOB, {"job": job, "period": period}, on=on, env=env)


def called(ledger: Ledger, job: str) -> bool:
    """Some Run of ``job`` has a model call recorded (recorded before the request leaves)."""
    runs = ledger.runs(job=job, limit=1000)
    return any(ledger.calls.of_runs([r.run_id for r in runs]).values())


def running_on(ledger: Ledger, job: str, host: str, hosts: Cluster) -> int:
    """Runs of ``job`` leased now by a process of ``host``."""
    pids = {str(p) for p in netns.pids_in(hosts.network.ns(host))}
    return sum(1 for r in ledger.runs(job=job, status="running", limit=1000)
               if r.owner is not None and r.owner.split(":")[1] in pids)


def leases_ended(ledger: Ledger, job: str) -> bool:
    """No Run of ``job`` is leased now (the database's clock): a dead or cut-off holder's Runs
    are claimable."""
    now = ledger.now()
    return all(r.lease_expires_at is None or r.lease_expires_at <= now
               for r in ledger.runs(job=job, status="running", limit=1000))


def drain(hosts: Cluster, ledger: Ledger, job: str, on: str, timeout: float = 240) -> int:
    """deliver-outbox flow runs on ``on`` until every message of ``job`` is sent, or uncertain
    and held for an operator (no retry scheduled); returns how many it took."""
    passes = 0

    def settled() -> bool:
        # An uncertain message with a retry scheduled is not settled: its resend is owed.
        return all(m.status == "sent" or (m.status == "uncertain" and m.next_attempt_at is None)
                   for r in ledger.runs(job=job, limit=1000)
                   for m in ledger.outbox.messages(run_id=r.run_id, limit=10))

    deadline = time.monotonic() + timeout
    while not settled():
        assert time.monotonic() < deadline, f"messages of {job} not delivered in {timeout} s"
        hosts.wait_final([hosts.run(DELIVER, {"batch_size": 50, "max_seconds": 20}, on=on)], 180)
        passes += 1
    return passes


def first_line_after(log: Path, since: datetime, text: str) -> float | None:
    """Seconds from ``since`` to the first line of a worker's log (lines start with the local
    time, HH:MM:SS.fff) that contains ``text``, or None."""
    for line in log.read_text(errors="replace").splitlines():
        if text in line and line[:2].isdigit():
            stamp = datetime.combine(since.date(), datetime.strptime(line[:12], "%H:%M:%S.%f").time())
            if stamp >= since:
                return (stamp - since).total_seconds()
    return None


def outcome(flow_run: FlowRun) -> str:
    """What a flow run's final state says happened: the outcome's own name, which leads the
    message of a ``Completed`` or ``Cached`` state (``InProgressElsewhere``, ``Duplicate``)."""
    return "none" if flow_run.state is None else outcome_name(flow_run.state)


def finish(hosts: Cluster, scenario: str, job: str, flow_runs: list[UUID],
           extra: dict[str, object], periods: tuple[str, ...] = (PERIOD,)) -> Summary:
    with hosts.ledger() as ledger:
        summary = check(scenario, ledger, job, JOBS[job][0], list(periods), hosts.maildir,
                        hosts.all_flow_runs(), extra)
    SUMMARIES.append(summary)
    return summary


# --- 1. a worker partitioned from the database ------------------------------------------------

def test_a_worker_cut_off_from_the_database_mid_transform_changes_nothing_after_takeover(
        hosts: Cluster) -> None:
    """w1 holds leases mid-transform when its link to db is cut for longer than the lease;
    w2 takes the Runs over and completes them; w1 notices within its client timeouts, and
    after the heal its late writes change nothing: every Run completed once."""
    job = PARTITION_DB
    with hosts.ledger() as ledger:
        first = tick(hosts, job, "w1")
        wait_until(lambda: running_on(ledger, job, "w1", hosts) > 0, 180,
                   "w1 to hold leases of its tick")
        wait_until(lambda: called(ledger, job), 60, "w1's first model call")
        held = running_on(ledger, job, "w1", hosts)
        hosts.network.cut("w1", "db")
        cut_at, cut_clock = time.monotonic(), datetime.now()
        try:
            # The cut outlasts w1's leases: its Runs are claimable once they end.
            wait_until(lambda: leases_ended(ledger, job), 4 * LEASE,
                       "w1's leases to end while it is cut off")
            takeover = tick(hosts, job, "w2")
            hosts.wait_final([takeover], 240)
            first_run = hosts.wait_final([first], 180)[0]
            noticed = time.monotonic() - cut_at
        finally:
            hosts.network.heal("w1", "db")
        late = tick(hosts, job, "w1")  # healed: w1 ticks the period again (a Duplicate)
        hosts.wait_final([late], 180)
        passes = drain(hosts, ledger, job, "w2")
    assert first_run.state is not None
    heard = first_line_after(hosts.workers["w1"].log, cut_clock, "LedgerUnavailable")
    finish(hosts, "1 worker cut from db", job, [first, takeover, late], {
        "w1 held": held,
        "w1's first LedgerUnavailable": f"{heard:.1f} s after the cut" if heard else "none",
        "w1's flow run": f"{outcome(first_run)} {noticed:.0f} s after the cut",
        "takeover": outcome(hosts.flow_runs([takeover])[0]),
        "delivery passes": passes})


# --- 2. a worker partitioned from the Prefect server ------------------------------------------

CUT_FROM_API = 90.0 if FULL else 45.0


@FULL_ONLY
def test_a_worker_cut_off_from_the_prefect_server_still_completes_every_run_once(
        hosts: Cluster) -> None:
    """w1's link to api is cut mid-tick while db stays reachable: its flow run goes on with
    the ledger, the server hears nothing (no heartbeat, no state), and after the heal every
    Run is completed once and every flow run ends in a terminal state."""
    job = PARTITION_API
    with hosts.ledger() as ledger:
        first = tick(hosts, job, "w1")
        wait_until(lambda: running_on(ledger, job, "w1", hosts) > 0, 180,
                   "w1 to hold leases of its tick")
        hosts.network.cut("w1", "api")
        cut_at = time.monotonic()
        try:
            done = wait_until(lambda: len(ledger.runs(job=job, status="completed", limit=1000))
                              == JOBS[job][0], 180, "the ledger to complete every Run")
            completed_after = time.monotonic() - cut_at
            time.sleep(max(0.0, CUT_FROM_API - (time.monotonic() - cut_at)))
            during = hosts.flow_runs([first])[0].state
        finally:
            hosts.network.heal("w1", "api")
        first_run = hosts.wait_final([first], 240)[0]
        again = tick(hosts, job, "w2")
        hosts.wait_final([again], 180)
        passes = drain(hosts, ledger, job, "w2")
    assert done and first_run.state is not None and during is not None
    finish(hosts, "2 worker cut from api", job, [first, again], {
        "Runs completed during the cut": f"after {completed_after:.0f} s",
        f"server's state of w1's flow run after {CUT_FROM_API:.0f} s cut": during.name,
        "its states": " > ".join(hosts.state_names(first)),
        "rerun": outcome(hosts.flow_runs([again])[0]),
        "delivery passes": passes})


# --- 3. a worker host lost, then the api host ---------------------------------------------------

API_DOWN = 60.0 if FULL else 30.0


@FULL_ONLY
def test_a_lost_worker_host_and_a_lost_api_host_need_no_manual_step(hosts: Cluster) -> None:
    """w1 is SIGKILLed whole mid-tick: reconcile (on w2) re-drives its stranded Runs once their
    leases expire; then the api host is down for a minute while w3 ticks: the workers come
    back by themselves and a new tick and reconcile run; every Run completed once."""
    job = LOSE
    with hosts.ledger() as ledger:
        today = ledger.now().date().isoformat()  # reconcile looks at the days it owes
        first = tick(hosts, job, "w1", period=today)
        wait_until(lambda: running_on(ledger, job, "w1", hosts) > 0, 180, "w1 to hold leases")
        wait_until(lambda: called(ledger, job), 60, "w1's first model call")
        killed = hosts.lose("w1")
        wait_until(lambda: leases_ended(ledger, job), 4 * LEASE, "the lost host's leases to end")
        reconciles: list[UUID] = []
        while len(ledger.runs(job=job, status="completed", limit=1000)) < JOBS[job][0]:
            assert len(reconciles) < 6, "reconcile did not re-drive the stranded Runs"
            reconciles.append(hosts.run(RECONCILE, {"job": job}, on="w2"))
            hosts.wait_final(reconciles[-1:], 300)
        hosts.start_worker("w1")  # the host is back
        hosts.wait_online("w1")
        # The crash detector marks the lost host's flow run Crashed (no heartbeat for
        # CRASH_AFTER_SECONDS) before the api host goes down: a detector window that ended
        # while the server was down was never acted on after its restart (the first full run).
        lost = wait_until(lambda: (run := hosts.flow_runs([first])[0]).state is not None
                          and run.state.is_final() and run, 240,
                          "the crash detector to mark the lost host's flow run")

        second = tick(hosts, job, "w3")
        wait_until(lambda: running_on(ledger, job, "w3", hosts) > 0, 180, "w3 to hold leases")
        hosts.stop_api()
        time.sleep(API_DOWN)
        hosts.start_api()
        hosts.wait_online(*WORKERS)
        second_run = hosts.wait_final([second], 300)[0]
        after = tick(hosts, job, "w2")
        again = hosts.run(RECONCILE, {"job": job}, on="w1")
        hosts.wait_final([after, again], 300)
        passes = drain(hosts, ledger, job, "w2")
    assert second_run.state is not None and isinstance(lost, FlowRun)
    finish(hosts, "3 worker host and api host lost", job, [first, *reconciles, second, after], {
        "w1 processes killed": len(killed), "reconcile passes to recover": len(reconciles),
        "the lost host's flow run": outcome(lost),
        f"flow run across the {API_DOWN:.0f} s api outage": outcome(second_run),
        "delivery passes": passes}, periods=(today, PERIOD))


# --- 5. slow, lossy links -------------------------------------------------------------------------

LINK_PORT = 6432


@FULL_ONLY
def test_a_tick_over_slow_lossy_links_to_the_database_completes_every_run_once(
        hosts: Cluster) -> None:
    """A tick whose every ledger connection crosses a link of 50 ms +/- 20 ms with 5% loss
    completes each Run once; figures: wall time and round trips per Run."""
    job, size = SLOW, JOBS[SLOW][0]
    stats = hosts.root / "link-stats.json"
    link = hosts.start("db", "link", [sys.executable, "-m", "tests.hosts.link", str(LINK_PORT),
                                      str(PG_PORT), "50", "20", "0.05", str(stats)],
                       {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    slow = {"RUNLEDGER_DATABASE_URL": hosts.ledger_url.replace(f":{PG_PORT}/", f":{LINK_PORT}/")}
    try:
        wait_until(stats.exists, 60, "the link to start")
        with hosts.ledger() as ledger:
            run = hosts.wait_final([tick(hosts, job, "w1", env=slow)], 900)[0]
            figures = json.loads(stats.read_text())
            passes = drain(hosts, ledger, job, "w2")
    finally:
        hosts.supervisor.terminate(link, 5)
    assert run.start_time is not None and run.end_time is not None and run.state is not None
    wall = (run.end_time - run.start_time).total_seconds()
    finish(hosts, "5 slow lossy links", job, [run.id], {
        "tick": f"{outcome(run)} in {wall:.0f} s ({1000 * wall / size:.0f} ms per Run)",
        "round trips per Run": f"{figures['chunks_up'] / size:.1f}",
        "link": f"{figures['connections']} connections, {figures['lost']} chunks delayed "
                "by a lost segment",
        "delivery passes": passes})


# --- 4. skewed clocks ------------------------------------------------------------------------

def faketime(offset: str) -> dict[str, str]:
    """The environment that moves a process's wall clock by ``offset`` with libfaketime
    (monotonic time untouched); its children inherit it."""
    if not FAKETIME_LIB.exists():
        pytest.fail(f"{FAKETIME_LIB} is missing: apt-get install -y faketime")
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}


@FULL_ONLY
def test_a_worker_whose_clock_is_ten_minutes_off_neither_expires_leases_early_nor_late(
        hosts: Cluster) -> None:
    """A flow run on w3 whose clock is 10 minutes behind takes leases that expire by the
    database clock (lease seconds after the database's now), and an overlapping one on w2, 10
    minutes ahead, finds them held, not expired: every Run completes once, by one Attempt.
    Only the flow-run processes' clocks are moved (libfaketime in the flow run's environment):
    a process worker whose own clock is behind picks its flow runs up that much later, as
    Prefect's worker asks for runs scheduled before its own now (docs/how-to/scale-out.md)."""
    job = SKEW
    with hosts.ledger() as ledger:
        behind = tick(hosts, job, "w3", env=faketime("-10m"))
        wait_until(lambda: running_on(ledger, job, "w3", hosts) > 0, 180, "w3 to hold leases")
        now = ledger.now()
        expiries = [r.lease_expires_at for r in ledger.runs(job=job, status="running",
                                                             limit=1000)
                    if r.lease_expires_at is not None]
        ahead = tick(hosts, job, "w2", env=faketime("+10m"))
        hosts.wait_final([behind, ahead], 300)

        passes = drain(hosts, ledger, job, "w1")
    off = [(e - now).total_seconds() for e in expiries]
    assert off and all(-1 <= s <= LEASE + 1 for s in off), off
    names = {run: outcome(hosts.flow_runs([run])[0])
             for run in (behind, ahead)}
    summary = finish(hosts, "4 skewed clocks", job, [behind, ahead], {
        "lease expiry minus db now (s)": f"{min(off):.1f}..{max(off):.1f}",
        "flow run at -10 min": names[behind], "overlapping flow run at +10 min": names[ahead],
        "delivery passes": passes})
    assert summary.attempts == {1: JOBS[job][0]}, "a Run was taken over before its lease expired"
    assert names[ahead] == "InProgressElsewhere", names


# --- 6. the dispatcher cut off from the mail host ---------------------------------------------

def test_a_dispatcher_cut_off_from_the_mail_host_after_acceptance_loses_no_message(
        hosts: Cluster) -> None:
    """The mail host has a message and holds its reply when w2's link to it is cut: the
    message becomes uncertain, is sent again with its same Message-ID after the heal, and no
    message is lost."""
    job = MAIL
    with hosts.ledger() as ledger:
        hosts.wait_final([tick(hosts, job, "w1")], 240)
        held = [message_id_for(m.message_id) for r in ledger.runs(job=job, limit=100)
                for m in ledger.outbox.messages(run_id=r.run_id, limit=10)
                if m.recipient in {recipient(job, s) for s in HELD}]
        dispatch = hosts.run(DELIVER, {"batch_size": 50, "max_seconds": 20}, on="w2")
        wait_until(lambda: set(held) <= set(sink_copies(hosts.maildir)), 120,
                   "the mail host to have the held messages")
        hosts.network.cut("w2", "mail")
        try:
            hosts.wait_final([dispatch], 180)
            statuses = dict(ledger.outbox.message_counts())
        finally:
            hosts.network.heal("w2", "mail")
        passes = drain(hosts, ledger, job, "w2")
        uncertain = sum(1 for r in ledger.runs(job=job, limit=100)
                        for m in ledger.outbox.messages(run_id=r.run_id, limit=10)
                        for a in ledger.outbox.delivery_attempts(m.message_id)
                        if a.outcome == "uncertain")
    assert uncertain >= len(held), (uncertain, statuses)
    finish(hosts, "6 dispatcher cut from mail", job, [dispatch], {
        "held at the sink when cut": len(held), "uncertain attempts": uncertain,
        "delivery passes after the heal": passes})


pytestmark = [pytest.mark.drill, pytest.mark.postgres, pytest.mark.timeout(3600 if FULL else 900)]
