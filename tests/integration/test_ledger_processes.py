"""Invariants under real concurrency and real crashes, on both dialects: separate OS processes
(spawned, so each has its own connections) race at a barrier, and workers die by SIGKILL.

One key claimed by 8 processes at once has exactly one winner, on a fresh database every round;
a business effect committed with a completion is all or nothing (a failure before commit leaves
nothing), applied once however many processes complete the same Run, and again for another
period."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from store import Claim, Completion, Ledger, OutboxMessage, RunIdentity
from store.faults import AFTER_COMPLETE_COMMIT
from store.faults import ENV as FAULTS_ENV
from tests.support.ledger import register_and_claim, wait_for_db_clock

pytestmark = pytest.mark.processes

PROCESSES = 8
DRILL_ROUNDS = 20  # rounds of the one-winner race: with the processes kept across rounds it is fast
REGISTER_ROUNDS = 40
PERIOD = datetime(2026, 9, 13, tzinfo=UTC)
LONG = timedelta(minutes=15)
SHORT = timedelta(seconds=1)
SPAWN = mp.get_context("spawn")

# The business effect: a balance credited once per completed daily Run. A separate
# MetaData keeps this test table out of the ledger's own schema.
BUSINESS = sa.MetaData()
BALANCE = sa.Table(
    "balance", BUSINESS,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("units", sa.Integer, nullable=False),
)

_barrier: Barrier | None = None


# --- code that runs in the spawned processes -------------------------------------------------


def _join_race(barrier: Barrier) -> None:
    global _barrier
    _barrier = barrier


def _start_together() -> None:
    assert _barrier is not None
    _barrier.wait(timeout=120)


def owner() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def credit(session: Session, output: dict[str, Any]) -> None:
    """The business effect: add ten units to the balance."""
    session.execute(sa.update(BALANCE).where(BALANCE.c.id == 1).values(units=BALANCE.c.units + 10))


def credit_then_fail(session: Session, output: dict[str, Any]) -> None:
    """The effect applies, then the job fails before the completion commits."""
    credit(session, output)
    raise RuntimeError("injected failure before commit")


def credit_then_die(session: Session, output: dict[str, Any]) -> None:
    """The effect applies, then the process is killed before the completion commits."""
    credit(session, output)
    os.kill(os.getpid(), signal.SIGKILL)


def credit_notice() -> list[OutboxMessage]:
    return [OutboxMessage("finance@example.com", "Daily credit applied", "10 units")]


def race_to_claim(url: str, run_id: str) -> bool:
    """Open a connection, wait for the others, then claim the shared Run."""
    ledger = Ledger.connect(url)
    try:
        ledger.get(run_id)  # connected before the race, so the race is the claim itself
        _start_together()
        return ledger.claim(run_id, owner(), LONG) is not None
    finally:
        ledger.close()


def race_to_register_and_claim(url: str, subject: str) -> bool:
    """Open a connection, wait for the others, then register and claim the same new Run."""
    ledger = Ledger.connect(url)
    try:
        ledger.database.now()
        _start_together()
        identity = RunIdentity("triage", subject, PERIOD, "v1")
        return register_and_claim(ledger, identity, owner=owner(), lease=LONG).claim is not None
    finally:
        ledger.close()


def race_to_complete(url: str, claim: Claim) -> tuple[bool, dict[str, Any] | None]:
    """Complete the shared claim with the credit effect, together with the others."""
    ledger = Ledger.connect(url)
    try:
        ledger.get(claim.run_id)
        _start_together()
        done = ledger.complete(claim, {"applied_by": owner()}, credit_notice(), effect=credit)
        return done.new, done.run.output
    finally:
        ledger.close()


def hold_lease_until_killed(url: str, run_id: str, report: Connection) -> None:
    """Claim with a short lease, report the claim, then hang as if stuck."""
    ledger = Ledger.connect(url)
    report.send(ledger.claim(run_id, owner(), SHORT))
    time.sleep(600)


def complete_and_crash_after_commit(url: str, run_id: str, report: Connection) -> None:
    """Complete a Run in a process started with the after-commit fault armed: SIGKILL between
    commit and return."""
    ledger = Ledger.connect(url)
    claim = ledger.claim(run_id, owner(), LONG)
    report.send(claim)
    assert claim is not None
    ledger.complete(claim, {"summary": "first"}, two_recipients())
    report.send("returned")  # never reached: the fault point kills the process first


def complete_and_die_inside_effect(url: str, claim: Claim) -> None:
    ledger = Ledger.connect(url)
    ledger.complete(claim, {"summary": "never committed"}, credit_notice(), effect=credit_then_die)


def two_recipients() -> list[OutboxMessage]:
    return [OutboxMessage(r, "Digest", "body") for r in ("ana@example.com", "ben@example.com")]


# --- helpers in the test process -------------------------------------------------------------


@pytest.fixture(scope="module")
def racers() -> Iterator[ProcessPoolExecutor]:
    """Eight spawned processes that start each task together (a barrier of eight)."""
    barrier = SPAWN.Barrier(PROCESSES)
    with ProcessPoolExecutor(PROCESSES, mp_context=SPAWN, initializer=_join_race,
                             initargs=(barrier,)) as pool:
        yield pool


def race(pool: ProcessPoolExecutor, task: Callable[..., Any], *args: Any) -> list[Any]:
    futures = [pool.submit(task, *args) for _ in range(PROCESSES)]
    return [f.result(timeout=180) for f in futures]


def spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Connection]:
    mine, theirs = SPAWN.Pipe()
    process = SPAWN.Process(target=target, args=(*args, theirs), daemon=True)
    process.start()
    theirs.close()  # the child holds the only write end: its death reads as EOF here
    return process, mine


def receive(conn: Connection) -> Any:
    assert conn.poll(120), "the child process reported nothing"
    return conn.recv()


def with_balance(url: str) -> Ledger:
    ledger = Ledger.connect(url)
    BUSINESS.create_all(ledger.engine)
    with ledger.engine.begin() as conn:
        conn.execute(sa.insert(BALANCE).values(id=1, units=0))
    return ledger


def balance(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.select(BALANCE.c.units)).scalar_one())


def daily(day: datetime = PERIOD) -> RunIdentity:
    return RunIdentity("daily-credit", "account-1", day, "v1")


# --- tests -----------------------------------------------------------------------------------


def test_eight_processes_claiming_one_key_have_exactly_one_winner_every_round(
    db_url: str, fresh_db_url: Callable[[], str], racers: ProcessPoolExecutor
) -> None:
    """Eight OS processes claim the same fresh Run at once, round after round
    on a fresh database each time; every round has exactly one winner and one Attempt."""
    for round_no in range(DRILL_ROUNDS):
        url = db_url if round_no == 0 else fresh_db_url()
        ledger = Ledger.connect(url)
        try:
            run = ledger.register(RunIdentity("triage", "issue-1", PERIOD, "v1"))
            wins = race(racers, race_to_claim, url, run.run_id)
            stored = ledger.get(run.run_id)
            assert wins.count(True) == 1, f"round {round_no}: {wins.count(True)} winners"
            assert (stored.fence, stored.attempts, len(ledger.attempts(run.run_id))) == (1, 1, 1)
        finally:
            ledger.close()


def test_eight_processes_registering_and_claiming_one_new_key_have_exactly_one_winner(
    db_url: str, racers: ProcessPoolExecutor
) -> None:
    """The same drill when the Run does not exist yet and every process inserts it claimed in
    one statement, a new key each round: one Run row, one winner, one Attempt, and no error
    (on PostgreSQL the losers of the insert race may first hit the identity index)."""
    ledger = Ledger.connect(db_url)
    try:
        for round_no in range(REGISTER_ROUNDS):
            wins = race(racers, race_to_register_and_claim, db_url, f"issue-{round_no}")
            run_id = RunIdentity("triage", f"issue-{round_no}", PERIOD, "v1").run_id
            stored = ledger.get(run_id)
            assert wins.count(True) == 1, f"round {round_no}: {wins.count(True)} winners"
            assert (stored.fence, stored.attempts, len(ledger.attempts(run_id))) == (1, 1, 1)
        assert len(ledger.runs(job="triage", limit=1000)) == REGISTER_ROUNDS
    finally:
        ledger.close()


def test_a_failure_before_commit_leaves_no_output_no_completion_and_no_effect(db_url: str) -> None:
    """The effect ran and then the job raised before commit; the rollback keeps the
    balance, the Run (still running, no output) and the outbox as they were."""
    ledger = with_balance(db_url)
    try:
        claim = ledger.claim(ledger.register(daily()).run_id, owner(), LONG)
        assert claim is not None
        with pytest.raises(RuntimeError, match="injected failure before commit"):
            ledger.complete(claim, {"summary": "lost"}, credit_notice(), effect=credit_then_fail)
        run = ledger.get(claim.run_id)
        assert (run.status, run.output, run.fence) == ("running", None, claim.fence)
        assert (balance(ledger), ledger.outbox.messages()) == (0, [])
        assert ledger.complete(claim, {"summary": "ok"}, credit_notice(), effect=credit).new
        assert balance(ledger) == 10
    finally:
        ledger.close()


def test_a_process_killed_before_commit_leaves_no_output_no_completion_and_no_effect(
    db_url: str,
) -> None:
    """The completing process dies by SIGKILL inside its transaction: nothing of it is kept,
    and after the lease expires another worker completes the Run and applies the effect once."""
    ledger = with_balance(db_url)
    try:
        run = ledger.register(daily())
        claim = ledger.claim(run.run_id, "doomed:1", SHORT)
        assert claim is not None
        process = SPAWN.Process(target=complete_and_die_inside_effect, args=(db_url, claim))
        process.start()
        process.join(120)
        assert process.exitcode == -signal.SIGKILL
        stored = ledger.get(run.run_id)
        assert (stored.status, stored.output) == ("running", None)
        assert (balance(ledger), ledger.outbox.messages()) == (0, [])
        wait_for_db_clock(ledger, claim.lease_expires_at)
        retry = ledger.claim(run.run_id, owner(), LONG)
        assert retry is not None
        assert ledger.complete(retry, {"summary": "ok"}, credit_notice(), effect=credit).new
        assert (balance(ledger), len(ledger.outbox.messages())) == (10, 1)
    finally:
        ledger.close()


def test_eight_concurrent_completions_apply_the_effect_once_and_another_period_applies_again(
    db_url: str, racers: ProcessPoolExecutor
) -> None:
    """Eight processes complete the same Run at once; one completes it and credits the
    balance, the other seven get that stored completion back; the next day credits again."""
    ledger = with_balance(db_url)
    try:
        claim = ledger.claim(ledger.register(daily()).run_id, owner(), LONG)
        assert claim is not None
        results = race(racers, race_to_complete, db_url, claim)
        winners = [output for new, output in results if new]
        assert len(winners) == 1
        assert all(output == winners[0] for _, output in results)
        assert ledger.get(claim.run_id).output == winners[0]
        assert (balance(ledger), len(ledger.outbox.messages())) == (10, 1)

        replay = ledger.complete(claim, {"applied_by": "replay"}, credit_notice(), effect=credit)
        assert replay == Completion(ledger.get(claim.run_id), new=False)
        assert balance(ledger) == 10

        next_day = ledger.claim(ledger.register(daily(PERIOD + timedelta(days=1))).run_id,
                                owner(), LONG)
        assert next_day is not None
        assert ledger.complete(next_day, {"applied_by": "next day"}, credit_notice(),
                                   effect=credit).new
        assert (balance(ledger), len(ledger.runs(status="completed")), len(ledger.outbox.messages())) == (
            20, 2, 2
        )
    finally:
        ledger.close()


def test_a_worker_killed_while_holding_the_lease_is_replaced_after_expiry(db_url: str) -> None:
    """A worker dies by SIGKILL holding the lease: nobody can claim until the lease expires by
    the database clock; then another worker claims (fence 2, attempts 2) and completes."""
    ledger = Ledger.connect(db_url)
    try:
        run = ledger.register(daily())
        process, conn = spawn(hold_lease_until_killed, db_url, run.run_id)
        dead: Claim = receive(conn)
        assert dead is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        assert process.exitcode == -signal.SIGKILL
        if ledger.database.now() < dead.lease_expires_at:
            assert ledger.claim(run.run_id, owner(), LONG) is None
        wait_for_db_clock(ledger, dead.lease_expires_at)
        claim = ledger.claim(run.run_id, owner(), LONG)
        assert claim is not None and claim.fence == 2
        done = ledger.complete(claim, {"summary": "finished by the replacement"})
        assert done.new and done.run.attempts == 2
        assert [a.outcome for a in ledger.attempts(run.run_id)] == ["expired", "completed"]
    finally:
        ledger.close()


def test_a_crash_right_after_the_completion_commit_is_retried_without_new_outbox_rows(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The completing process is killed after its commit and before it returns: the retry finds
    the Run completed, gets the stored output back and adds no outbox rows."""
    ledger = Ledger.connect(db_url)
    try:
        run = ledger.register(daily())
        # Read by the child when it imports store; this process read it long ago.
        monkeypatch.setenv(FAULTS_ENV, AFTER_COMPLETE_COMMIT)
        process, conn = spawn(complete_and_crash_after_commit, db_url, run.run_id)
        monkeypatch.delenv(FAULTS_ENV)
        claim: Claim = receive(conn)
        process.join(120)
        assert process.exitcode == -signal.SIGKILL
        with pytest.raises(EOFError):  # it never reported returning from complete
            conn.recv()
        stored = ledger.get(run.run_id)
        assert (stored.status, stored.output) == ("completed", {"summary": "first"})
        assert len(ledger.outbox.messages()) == 2

        assert ledger.register(daily()).status == "completed"
        assert ledger.claim(run.run_id, owner(), LONG) is None
        retry = ledger.complete(claim, {"summary": "second"}, two_recipients())
        assert (retry.new, retry.run.output) == (False, {"summary": "first"})
        assert len(ledger.outbox.messages()) == 2
        assert [a.outcome for a in ledger.attempts(run.run_id)] == ["completed"]
    finally:
        ledger.close()
