"""A hold nobody answers by its deadline: `runledger overdue` reports it (exit status 1), and
reconcile ends it as the job's approval says: rejected by the deadline (never sent, recorded as
decided by ``deadline``), or still held and still reported."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from typer.testing import Result

from flows.jobs import Approval
from flows.occurrences.prepare import prepare
from flows.reconcile.flow import decide
from store import Ledger
from tests.support.delivery import statuses
from tests.support.pipeline import Env, probe_job

PERIOD = "2026-01-05"
DEADLINE = timedelta(seconds=1)


def past_every_deadline(ledger: Ledger, job: str) -> None:
    """Poll the database clock until every held message of ``job`` is past its deadline."""
    limit = time.monotonic() + 30
    while any(h.message.hold_until is None or h.message.hold_until > ledger.now()
              for h in ledger.outbox.held(job=job)):
        assert time.monotonic() < limit, f"waited 30 s for the holds of {job} to pass"
        time.sleep(0.1)


@pytest.mark.parametrize("on_deadline", ["reject", "wait"])
def test_an_unanswered_hold_is_reported_overdue_and_ends_as_the_job_says(
        env: Env, invoke: Callable[..., Result], on_deadline: str) -> None:
    """After the deadline: overdue lists both messages and exits 1; reconcile rejects them by
    the deadline (reject) or leaves them held and reported (wait)."""
    probe = probe_job(approval=Approval(deadline=DEADLINE, on_deadline=on_deadline))  # type: ignore[arg-type]
    state, _ = env.run(probe.name, period=PERIOD)
    assert state.is_completed(), state.message
    assert statuses(env.ledger) == {"held": 2}
    past_every_deadline(env.ledger, probe.name)
    report = invoke("overdue", "--job", probe.name, "--json")
    assert report.exit_code == 1
    holds = json.loads(report.stdout)["holds"]
    assert sorted(h["recipient"] for h in holds) == ["a@example.com", "b@example.com"]
    done = decide(env.ledger, prepare(env.ledger, probe.job, dry_run=False))
    if on_deadline == "reject":
        assert len(done.holds_rejected) == 2 and "rejected by their deadline" in done.summary()
        assert statuses(env.ledger) == {"rejected": 2}
        rejected = env.ledger.outbox.message(done.holds_rejected[0])
        assert rejected is not None and rejected.decided_by == "deadline"
        assert json.loads(invoke("overdue", "--job", probe.name, "--json").stdout)["holds"] == []
    else:
        assert done.holds_rejected == [] and statuses(env.ledger) == {"held": 2}
        assert len(json.loads(invoke("overdue", "--job", probe.name, "--json").stdout)["holds"]) == 2


def test_a_hold_before_its_deadline_is_not_overdue_nor_rejected(env: Env) -> None:
    """A day's deadline: reconcile leaves the messages held."""
    probe = probe_job(approval=Approval(deadline=timedelta(days=1), on_deadline="reject"))
    env.run(probe.name, period=PERIOD)
    done = decide(env.ledger, prepare(env.ledger, probe.job, dry_run=False))
    assert done.holds_rejected == [] and statuses(env.ledger) == {"held": 2}
