"""The Run state machine against a small in-memory model (Hypothesis stateful testing), on both
dialects: register, claim, renew, save_input, complete, fail, requeue and lease expiry in any
order, by several owners holding current and stale claims."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from store import Claim, LeaseLost, Ledger, OutboxMessage, RunConflict, RunIdentity
from store.errors import InvalidTransition
from store.models import runs_table
from tests.support.ledger import register_and_claim

OWNERS = ("worker-1:101", "worker-2:202", "worker-3:303")
LEASE = timedelta(minutes=10)
PERIOD = datetime(2026, 11, 29, tzinfo=UTC)


@dataclass
class Model:
    """What the ledger should hold for the one Run a machine drives."""

    params: int | None = None  # None: not registered yet
    status: str = "pending"
    fence: int = 0
    owner: str | None = None
    lease_live: bool = False
    attempts: int = 0
    raw_input: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    messages: int = 0
    outcomes: list[str | None] = field(default_factory=list)

    def holds(self, claim: Claim) -> bool:
        return self.status == "running" and (claim.fence, claim.owner) == (self.fence, self.owner)


def machine_for(ledger: Ledger) -> type[RuleBasedStateMachine]:
    class RunMachine(RuleBasedStateMachine):
        claims = Bundle("claims")

        def __init__(self) -> None:
            super().__init__()
            self.identity = RunIdentity("machine", uuid.uuid4().hex, PERIOD, "v1")
            self.run_id = self.identity.run_id
            self.model = Model()

        @precondition(lambda self: self.model.params is None)
        @rule(variant=st.sampled_from([0, 1]))
        def register(self, variant: int) -> None:
            self.register_again(variant)

        @precondition(lambda self: self.model.params is not None)
        @rule(variant=st.sampled_from([0, 1]))
        def register_again(self, variant: int) -> None:
            m = self.model
            if m.params is not None and variant != m.params:
                with pytest.raises(RunConflict):
                    ledger.register(self.identity, {"variant": variant})
                return
            run = ledger.register(self.identity, {"variant": variant})
            m.params = variant
            assert (run.status, run.fence) == (m.status, m.fence)

        @precondition(lambda self: self.model.params is not None)
        @rule(target=claims, owner=st.sampled_from(OWNERS))
        def claim(self, owner: str) -> Any:
            m = self.model
            claimable = m.status in ("pending", "running") and (not m.lease_live or m.owner == owner)
            claim = ledger.claim(self.run_id, owner, LEASE)
            assert (claim is not None) == claimable
            return self.claimed(claim, owner)

        @rule(target=claims, owner=st.sampled_from(OWNERS), variant=st.sampled_from([0, 1]))
        def register_and_claim(self, owner: str, variant: int) -> Any:
            """register then claim in one statement: the same rules as the two calls."""
            m = self.model
            if m.params is not None and variant != m.params:
                with pytest.raises(RunConflict):
                    register_and_claim(ledger, self.identity, {"variant": variant}, owner=owner,
                                       lease=LEASE)
                return multiple()
            claimable = m.status in ("pending", "running") and (not m.lease_live or m.owner == owner)
            entered = register_and_claim(ledger, self.identity, {"variant": variant}, owner=owner,
                                         lease=LEASE)
            m.params = variant
            assert (entered.claim is not None) == claimable
            return self.claimed(entered.claim, owner)

        def claimed(self, claim: Claim | None, owner: str) -> Any:
            if claim is None:
                return multiple()
            m = self.model
            m.fence, m.owner, m.status, m.lease_live = m.fence + 1, owner, "running", True
            m.attempts += 1
            m.outcomes = ["expired" if o is None else o for o in m.outcomes] + [None]
            assert claim.fence == m.fence
            return claim

        @precondition(lambda self: self.model.lease_live)
        @rule()
        def lease_expires(self) -> None:
            """Time passes: the lease end moves behind the database clock."""
            past = ledger.database.now() - timedelta(seconds=1)
            with ledger.engine.begin() as conn:
                conn.execute(
                    sa.update(runs_table).where(runs_table.c.run_id == self.run_id)
                    .values(lease_expires_at=past)
                )
            self.model.lease_live = False

        @rule(claim=claims)
        def renew(self, claim: Claim) -> None:
            if not self.model.holds(claim):
                assert ledger.renew_many([claim], LEASE) == {}
                return
            assert claim.run_id in ledger.renew_many([claim], LEASE)
            self.model.lease_live = True

        @rule(claim=claims, value=st.integers(0, 2))
        def save_input(self, claim: Claim, value: int) -> None:
            m = self.model
            if not m.holds(claim):
                with pytest.raises(LeaseLost):
                    ledger.save_input(claim, {"value": value})
                return
            m.raw_input = m.raw_input or {"value": value}
            assert ledger.save_input(claim, {"value": value}) == m.raw_input

        @rule(claim=claims, value=st.integers(0, 2))
        def complete(self, claim: Claim, value: int) -> None:
            m = self.model
            notice = [OutboxMessage("ops@example.com", "done", f"value {value}")]
            if m.holds(claim):
                done = ledger.complete(claim, {"value": value}, notice)
                assert done.new
                m.status, m.output, m.owner, m.lease_live = "completed", {"value": value}, None, False
                m.messages, m.outcomes[-1] = 1, "completed"
            elif m.status == "completed":
                done = ledger.complete(claim, {"value": value}, notice)
                assert (done.new, done.run.output) == (False, m.output)
            else:
                with pytest.raises(LeaseLost):
                    ledger.complete(claim, {"value": value}, notice)

        @rule(claim=claims, retryable=st.booleans())
        def fail(self, claim: Claim, retryable: bool) -> None:
            m = self.model
            if not m.holds(claim):
                with pytest.raises(LeaseLost):
                    ledger.fail(claim, "boom", retryable=retryable)
                return
            ledger.fail(claim, "boom", retryable=retryable)
            m.status = "pending" if retryable else "failed"
            m.owner, m.lease_live = None, False
            m.outcomes[-1] = "released" if retryable else "failed"

        @precondition(lambda self: self.model.status in ("failed", "completed"))
        @rule()
        def requeue(self) -> None:
            if self.model.status != "failed":
                with pytest.raises(InvalidTransition):
                    ledger.requeue_run(self.run_id)
                return
            assert ledger.requeue_run(self.run_id).status == "pending"
            self.model.status = "pending"

        @invariant()
        def ledger_matches_the_model(self) -> None:
            m = self.model
            found = ledger.get_many([self.run_id])
            if m.params is None:
                assert found == {}
                return
            run = found[self.run_id]
            assert (run.status, run.fence, run.owner, run.attempts) == (
                m.status, m.fence, m.owner, m.attempts
            )
            assert (run.raw_input, run.output) == (m.raw_input, m.output)
            if m.status == "running":
                assert run.lease_expires_at is not None
                assert (run.lease_expires_at > ledger.database.now()) == m.lease_live
            else:
                assert run.lease_expires_at is None
            assert len(ledger.outbox.messages(run_id=self.run_id)) == m.messages
            assert [a.outcome for a in ledger.attempts(self.run_id)] == m.outcomes

    return RunMachine


def test_the_run_state_machine_matches_its_model(ledger: Ledger) -> None:
    """Any sequence of transitions by current and stale holders leaves the ledger exactly where
    the model says: one fence holder at a time, first input kept, output written once."""
    run_state_machine_as_test(
        machine_for(ledger),
        settings=settings(
            max_examples=40, stateful_step_count=30, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
