"""The on-call view on both ledgers: every unfinished Run listed with who holds its lease and
until when (`status`, `overdue`), leases taken over by an operator (`runs release`) so that a
holder that was not dead is refused at its next write, and a rerun that finds its Runs held
elsewhere exiting 3."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from typer.testing import Result

from flows.jobs.budget import Budget
from flows.jobs.competitor_summary import job as competitor_summary
from store import OVER_BUDGET_ERROR, LeaseLost, Ledger, RunIdentity
from store.errors import InvalidInput, InvalidTransition, RunNotFound
from tests.support.ledger import register_and_claim, snapshot
from tests.support.pipeline import (
    ACME,
    SUMMARY,
    USAGE,
    Env,
    ModelServer,
    Worker,
    outbox_recipients,
    probe_job,
    wait_until,
)

PERIOD = "2026-01-05"
DEAD = "worker-b:4242"  # a lease owner an operator says is dead


def identity(subject: str, days: int = 0) -> RunIdentity:
    period = competitor_summary.parse_period(PERIOD)
    return RunIdentity("oncall", subject, period.start + timedelta(days=days), "1")


# --- the ledger -------------------------------------------------------------------------------


def test_unfinished_lists_held_stranded_over_budget_and_pending_runs_as_judged_at_now(
        ledger: Ledger) -> None:
    """Pending, over-budget (released by the budget) and held Runs are listed with their lease;
    the held one is stranded at a ``now`` past its lease's end; completed and failed are not."""
    ledger.register(identity("pending"))
    refused = register_and_claim(ledger, identity("refused"), owner="w:1", lease=60).claim
    assert refused is not None
    ledger.calls.release_over_budget(refused, f"{OVER_BUDGET_ERROR}raise the cap")
    held = register_and_claim(ledger, identity("held"), owner=DEAD, lease=600).claim
    assert held is not None
    for subject, retryable in (("done", None), ("failed", False)):
        claim = register_and_claim(ledger, identity(subject), owner="w:1", lease=60).claim
        assert claim is not None
        if retryable is None:
            ledger.complete(claim, {"text": "ok"})
        else:
            ledger.fail(claim, "refused", retryable=retryable)
    now = ledger.now()
    found = {run.subject: run for run in ledger.unfinished(job="oncall", now=now)}
    assert {s: r.kind for s, r in found.items()} == {
        "pending": "pending", "refused": "over-budget", "held": "held"}
    assert (found["held"].owner, found["held"].lease_expires_at, found["held"].fence) == (
        DEAD, held.lease_expires_at, held.fence)
    assert found["pending"].owner is None and found["pending"].lease_expires_at is None
    later = ledger.unfinished(job="oncall", now=held.lease_expires_at + timedelta(seconds=1))
    assert {r.subject: r.kind for r in later}["held"] == "stranded"
    assert ledger.unfinished(job="another-job") == []


def test_taking_over_a_lease_raises_the_fence_and_refuses_the_holders_next_write(
        ledger: Ledger) -> None:
    """The Run goes pending at fence + 1 with its Attempt ended released; the old claim can
    neither renew, save its input nor complete; the next claim completes it once."""
    claim = register_and_claim(ledger, identity("acme"), owner=DEAD, lease=600).claim
    assert claim is not None
    [taken] = ledger.take_over(claim.run_id)
    assert (taken.status, taken.fence, taken.owner, taken.lease_expires_at) == (
        "pending", claim.fence + 1, None, None)
    assert taken.error is not None and taken.error.startswith(f"lease of {DEAD} taken over")
    [attempt] = ledger.attempts(claim.run_id)
    assert (attempt.outcome, attempt.error) == ("released", taken.error)
    assert ledger.renew_many([claim], 600) == {}
    with pytest.raises(LeaseLost):
        ledger.save_input(claim, {"text": "late"})
    with pytest.raises(LeaseLost):
        ledger.complete(claim, {"text": "stale"})
    again = ledger.claim(claim.run_id, "w:2", 60)
    assert again is not None and again.fence == claim.fence + 2
    done = ledger.complete(again, {"text": "fresh"})
    assert done.new and done.run.output == {"text": "fresh"}
    assert [a.outcome for a in ledger.attempts(claim.run_id)] == ["released", "completed"]


def test_taking_over_an_owner_releases_every_run_it_holds_and_no_other(ledger: Ledger) -> None:
    """--owner: the dead owner's two Runs are released; another owner's stays held."""
    mine = [register_and_claim(ledger, identity(s), owner=DEAD, lease=600).claim
            for s in ("acme", "globex")]
    other = register_and_claim(ledger, identity("initech"), owner="w:9", lease=600).claim
    assert other is not None and all(c is not None for c in mine)
    taken = ledger.take_over(owner=DEAD)
    assert sorted(r.subject for r in taken) == ["acme", "globex"]
    assert ledger.get(other.run_id).status == "running"
    assert {r.subject: r.kind for r in ledger.unfinished(job="oncall")} == {
        "acme": "pending", "globex": "pending", "initech": "held"}


def test_a_run_that_holds_no_lease_cannot_be_taken_over_and_nothing_is_written(
        ledger: Ledger) -> None:
    """Pending, completed, unknown, an owner holding nothing, or both or neither of id and
    owner: a clear refusal, and the ledger unchanged."""
    pending = ledger.register(identity("pending"))
    claim = register_and_claim(ledger, identity("done"), owner="w:1", lease=60).claim
    assert claim is not None
    ledger.complete(claim, {"text": "ok"})
    before = snapshot(ledger)
    with pytest.raises(InvalidTransition, match="is pending and holds no lease"):
        ledger.take_over(pending.run_id)
    with pytest.raises(InvalidTransition, match="is completed and holds no lease"):
        ledger.take_over(claim.run_id)
    with pytest.raises(RunNotFound):
        ledger.take_over("0" * 64)
    with pytest.raises(InvalidTransition, match="no running Run is leased by 'nobody:1'"):
        ledger.take_over(owner="nobody:1")
    with pytest.raises(InvalidInput, match="not both nor neither"):
        ledger.take_over()
    with pytest.raises(InvalidInput, match="not both nor neither"):
        ledger.take_over(pending.run_id, owner="w:1")
    assert snapshot(ledger) == before


# --- the command line -------------------------------------------------------------------------


def test_runs_release_refusals_print_one_line_and_exit_2(
        ledger: Ledger, invoke: Callable[..., Result]) -> None:
    """An unknown Run, a completed one, a pending one, an owner that holds nothing, neither
    RUN nor --owner: exit 2 and one line on stderr; a held one is released, exit 0."""
    pending = ledger.register(identity("pending"))
    claim = register_and_claim(ledger, identity("done"), owner="w:1", lease=60).claim
    assert claim is not None
    ledger.complete(claim, {"text": "ok"})
    held = register_and_claim(ledger, identity("held"), owner=DEAD, lease=600).claim
    assert held is not None
    refusals = {
        ("runs", "release", "ffffffff"): "no run with",
        ("runs", "release", claim.run_id): "is completed and holds no lease",
        ("runs", "release", pending.run_id[:12]): "is pending and holds no lease",
        ("runs", "release", "--owner", "nobody:1"): "no running Run is leased by 'nobody:1'",
        ("runs", "release"): "one of the two",
    }
    for args, said in refusals.items():
        done = invoke(*args, env={"COLUMNS": "300"})  # one line, not folded at 80 columns
        assert done.exit_code == 2, (args, done.output)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    released = invoke("runs", "release", "--owner", DEAD, env={"COLUMNS": "300"})
    assert released.exit_code == 0, released.output
    assert released.stdout.startswith(f"released {held.run_id[:12]} oncall/held/")
    assert f"now pending at fence {held.fence + 1}" in released.stdout


def test_status_and_overdue_show_held_over_budget_and_pending_runs_after_a_tick(
        env: Env, model_server: ModelServer, invoke: Callable[..., Result]) -> None:
    """A tick with room for one call in its budget, a subject held by a dead worker and one
    left pending: status and overdue list the held, over-budget and pending Runs with the
    lease's owner and end, and a summary line; overdue exits 1."""
    env.set(model_max_tokens=16)  # a call's bound below its estimate: one call fits the cap
    tokens = USAGE["total_tokens"]
    probe = probe_job(["s0", "s1", "s2", "s3"], budget=Budget(
        per_period=tokens, unit="tokens", call_estimate=tokens))
    period = probe.job.latest_due_period(env.ledger.now())
    pending = env.ledger.register(probe.job.identity("s2", period),
                                  probe.job.run_params("s2", period))
    held = register_and_claim(env.ledger, probe.job.identity("s3", period),
                              probe.job.run_params("s3", period), owner=DEAD, lease=600).claim
    assert held is not None
    ran = invoke("run", probe.name, "--subject", "s0", "--subject", "s1", "--subject", "s3",
                 "--period", period.label, "--json")
    report = json.loads(ran.stdout)
    assert Counter(s["outcome"] for s in report["subjects"]) == {
        "new": 1, "over-budget": 1, "in-progress-elsewhere": 1}, report

    status = invoke("status", probe.name, "--json")
    assert status.exit_code == 0, status.output
    [board] = json.loads(status.stdout)
    kinds = {row["subject"]: row for row in board["unfinished"]}
    assert Counter(row["state"] for row in kinds.values()) == {
        "held": 1, "over-budget": 1, "pending": 1}
    assert (kinds["s3"]["owner"], kinds["s3"]["lease_until"]) == (
        DEAD, held.lease_expires_at.isoformat() if held.lease_expires_at else None)
    assert kinds["s2"]["run_id"] == pending.run_id and kinds["s2"]["owner"] is None
    table = invoke("status", probe.name, env={"COLUMNS": "100"})
    assert "3 unfinished Runs: 1 held, 1 over-budget, 1 pending" in table.stdout.splitlines()
    assert DEAD in table.stdout

    overdue = invoke("overdue", "--job", probe.name, "--json")
    assert overdue.exit_code == 1, overdue.output
    listed = json.loads(overdue.stdout)["unfinished"]
    assert [row["state"] for row in listed] == [kinds[row["subject"]]["state"] for row in listed]
    assert len(listed) == 3
    lines = invoke("overdue", "--job", probe.name, env={"COLUMNS": "80"})
    assert lines.exit_code == 1
    assert "3 unfinished Runs: 1 held, 1 over-budget, 1 pending" in lines.stdout.splitlines()
    assert max(len(line) for line in lines.stdout.splitlines()) <= 80, lines.stdout
    assert "runledger runs release RUN" in lines.stdout


def test_a_rerun_of_runs_held_elsewhere_exits_3_naming_the_leases_end_and_completes_after_release(
        env: Env, invoke: Callable[..., Result]) -> None:
    """A dead worker's lease: `run` exits 3 and names who holds it until when, with no model
    call; `runs release` takes it over and the rerun completes it with one set of rows."""
    period = competitor_summary.parse_period(PERIOD)
    held = register_and_claim(env.ledger, competitor_summary.identity("acme", period),
                              competitor_summary.run_params("acme", period), owner=DEAD,
                              lease=900).claim
    assert held is not None and held.lease_expires_at is not None
    refused = invoke("run", SUMMARY, "--subject", "acme", "--period", PERIOD)
    assert refused.exit_code == 3, refused.output
    until = held.lease_expires_at.isoformat(timespec="seconds")
    assert f"leased by {DEAD} until {until}" in refused.stderr
    assert "runledger runs release RUN" in refused.stderr
    assert env.model_calls() == 0
    assert invoke("runs", "release", held.run_id).exit_code == 0
    again = invoke("run", SUMMARY, "--subject", "acme", "--period", PERIOD, "--json")
    assert again.exit_code == 0, again.output
    assert [s["outcome"] for s in json.loads(again.stdout)["subjects"]] == ["new"]
    assert env.ledger.get(held.run_id).status == "completed"
    assert outbox_recipients(env.ledger, held.run_id) == ACME
    assert [a.outcome for a in env.ledger.attempts(held.run_id)] == ["released", "completed"]


# --- a live holder ----------------------------------------------------------------------------


@pytest.fixture
def worker() -> Iterator[list[Worker]]:
    """The worker subprocess a test starts, killed at the end whatever happened."""
    started: list[Worker] = []
    yield started
    for one in started:
        one.kill()


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
def test_releasing_a_live_holders_lease_refuses_its_next_write_and_nothing_is_written_twice(
        env: Env, worker: list[Worker], invoke: Callable[..., Result]) -> None:
    """A real `runledger run` process frozen (SIGSTOP) inside its model call while an operator
    releases its Run: resumed, its answer is refused and it ends LeaseLost, writing no output
    and no outbox row; the rerun completes the Run once, with one set of outbox rows."""
    # The model's answer is 10 s away: the worker is frozen long before it arrives.
    env.set(offline_model_delay_seconds=10, lease_seconds=900)
    holder = Worker.start([SUMMARY, "--subject", "acme", "--period", PERIOD])
    worker.append(holder)
    wait_until(lambda: any(c["pid"] == holder.pid for c in env.calls()), 90,
               "the worker's model call to be recorded")
    holder.signal(signal.SIGSTOP)
    [call] = env.calls()
    assert call["outcome"] is None, call  # frozen with its call in flight
    run = env.the_run("acme", PERIOD)
    assert run.status == "running" and run.owner is not None
    released = invoke("runs", "release", "--owner", run.owner)
    assert released.exit_code == 0, released.output
    holder.signal(signal.SIGCONT)
    code, report, err = holder.finish()
    assert code == 0, err
    assert report is not None and report["state"] == "LeaseLost", report
    assert report["subjects"][0]["outcome"] == "lease-lost"
    after = env.ledger.get(run.run_id)
    assert (after.status, after.output, after.fence) == ("pending", None, run.fence + 1)
    assert outbox_recipients(env.ledger, run.run_id) == []
    env.set(offline_model_delay_seconds=0)
    again = invoke("run", SUMMARY, "--subject", "acme", "--period", PERIOD, "--json")
    assert again.exit_code == 0, again.output
    assert [s["outcome"] for s in json.loads(again.stdout)["subjects"]] == ["new"]
    assert outbox_recipients(env.ledger, run.run_id) == ACME
    outcomes = [a.outcome for a in env.ledger.attempts(run.run_id)]
    assert outcomes == ["released", "completed"], outcomes
    assert env.ledger.get(run.run_id).output is not None
