"""The ledger's model calls and budgets (``Ledger.calls``): each method is one unit of work
around one transition of ``store.model_calls`` (its steps chosen by ``store.call_plan``),
``store.checkpoints``, ``store.savings``, ``store.endpoint_limits``,
``store.announced_limits`` or ``store.budgets``, followed by its fault point."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from store import announced_limits as al
from store import budgets, faults
from store import checkpoints as ck
from store import endpoint_limits as el
from store import model_calls as mc
from store import savings as sv
from store.call_plan import NO_USAGE, End, InFlight, Intent, Usage
from store.call_tables import BudgetWindow, EndpointLimit, ModelCall
from store.errors import LeaseLost
from store.lease import Claim
from store.units_of_work import UnitsOfWork
from store.validators import error_text, json_document


class CallBook:
    """Every model call of the ledger's Runs, recorded before it leaves, and the budgets they
    reserve against (``Ledger.calls``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def record_intent(self, claim: Claim, intent: Intent) -> InFlight:
        """Record the call in flight before it leaves, after the steps it carries (its budget
        charge reserved, the slot of an endpoint that bounds its calls in flight taken);
        ``LeaseLost`` if the Attempt no longer holds the Run (its fence moved on);
        ``BudgetExhausted`` (nothing reserved, the refusal counted) if a window has no room;
        ``SlotUnavailable`` (nothing recorded) with how long to wait if the endpoint's limits
        allow no call now."""
        write = self._ledger._write
        try:
            found = write(faults.AFTER_CALL_INTENT_COMMIT, mc.record_intent_txn, claim, intent)
        except budgets.BudgetExhausted as exc:
            assert intent.charge is not None  # only a charge is refused
            refusal, first = write(faults.AFTER_REFUSE_BUDGET_COMMIT, budgets.refuse_txn,
                                   exc.refusal, intent.charge)
            raise budgets.BudgetExhausted(str(exc), refusal, first) from None
        if isinstance(found, el.SlotDecision):
            raise el.SlotUnavailable(found)
        return found

    def take_slot(self, slot: el.Slot) -> el.SlotDecision:
        """Take a call's slot of an endpoint that does not bound its calls in flight, or the
        decision that says how long to wait; the call is then recorded by ``record_intent``
        carrying it (a slot taken for a call never recorded only leaves its endpoint a request
        early)."""
        return self._ledger._write(faults.AFTER_TAKE_SLOT_COMMIT, el.take_slot_txn, slot)

    def configure_endpoint(self, name: str, limits: el.Limits) -> None:
        """Create the endpoint's shared limits, or replace what is configured (a tick does as
        it starts; the same configuration keeps the adaptive rate learned so far)."""
        # The fault points are the call's own: the limits' writes ride beside its records.
        self._ledger._write(faults.AFTER_CALL_INTENT_COMMIT, el.configure_txn, name, limits)

    def endpoint_refused(self, call: InFlight, pause_seconds: float | None,
                         max_pause_seconds: float) -> datetime | None:
        """The provider refused the call (a 429): pause its endpoint for every worker for
        ``pause_seconds`` (None: a backoff), at most ``max_pause_seconds``; until when."""
        if call.slot is None:
            return None
        return self._ledger._write(faults.AFTER_CALL_FAILURE_COMMIT, el.refuse_txn,
                                   call.slot.endpoint, call.slot.tokens, pause_seconds,
                                   max_pause_seconds)

    def endpoint_answered(self, call: InFlight, usage: Usage,
                          announced: al.Announcement | None = None) -> None:
        """Settle the tokens the call took of its endpoint to what it used (its estimate when
        the provider reported none), take in the limits its answer ``announced`` and raise
        the endpoint's rate by a step."""
        if call.slot is not None:
            used = usage.tokens if usage.prompt_tokens is not None else call.slot.tokens
            self._ledger._write(faults.AFTER_CHECKPOINT_COMMIT, al.answered_txn,
                                call.slot.endpoint, call.slot.tokens, used, announced)

    def endpoint_limit(self, name: str) -> EndpointLimit | None:
        """The endpoint's limits and their state, if it has any."""
        return self._ledger._read(el.read_limit, name)

    def record_answer(self, call: InFlight, answer: dict[str, Any], usage: Usage) -> None:
        """Record the call answered with its usage and checkpoint its answer, in one commit;
        ``LeaseLost`` (after recording the usage) if the Attempt's lease had ended."""
        answer = json_document(answer, "model answer", self._ledger.max_output_bytes)
        if self._end(call, End("answered", usage, answer=answer)) != "answered":
            raise LeaseLost(f"run {call.claim.run_id}: the lease of fence {call.claim.fence} "
                            "ended while the model answered; the call is recorded lost")

    def record_failure(self, call: InFlight, outcome: str, error: str,
                       usage: Usage = NO_USAGE) -> None:
        """Record the call refused (the provider's error reply) or failed (no usable answer)."""
        self._end(call, End(outcome, usage, error=error))

    def _end(self, call: InFlight, end: End) -> str | None:
        point = (faults.AFTER_CHECKPOINT_COMMIT if end.outcome == "answered"
                 else faults.AFTER_CALL_FAILURE_COMMIT)
        return self._ledger._write(point, mc.record_end_txn, call, end)

    def mark_lost(self, run_id: str) -> list[str]:
        """Mark lost the Run's calls in flight whose Attempt no longer holds the Run."""
        return self._ledger._write(faults.AFTER_MARK_LOST_COMMIT, mc.mark_lost_txn, run_id)

    def replay(self, claim: Claim, position: int, prompt_digest: str) -> ck.Checkpoint | None:
        """The checkpointed answer of this position for the same prompt, counted as reused."""
        return self._ledger._write(faults.AFTER_REPLAY_COMMIT, ck.replay_txn,
                                   claim, position, prompt_digest)

    def reject_answers(self, claim: Claim) -> list[str]:
        """Validation rejected the candidate: its answers are never replayed."""
        return self._ledger._write(faults.AFTER_REJECT_ANSWERS_COMMIT, ck.reject_answers_txn,
                                   claim)

    def of_run(self, run_id: str) -> list[ModelCall]:
        """A Run's model calls in the order they were made (answers left out)."""
        return self._ledger._read(mc.list_calls, run_id)

    def of_runs(self, run_ids: Sequence[str]) -> dict[str, list[ModelCall]]:
        """The model calls of each of ``run_ids``, in one read."""
        return self._ledger._read(mc.list_calls_of, run_ids)

    def since(self, since: datetime, job: str | None = None) -> list[dict[str, Any]]:
        """The model calls started from ``since`` on, optionally of one job, as plain rows."""
        return self._ledger._read(mc.read_calls_since, since, job)

    def count_saved(self, job: str, day: date, run_ids: Sequence[str]) -> None:
        """Add the answered calls' stored cost of the duplicate Runs one tick suppressed to
        ``job``'s savings of the UTC ``day`` (see ``count_saved_txn``)."""
        if run_ids:
            self._ledger._write(faults.AFTER_COUNT_SAVED_COMMIT, sv.count_saved_txn,
                                job, day, run_ids)

    def saved_since(self, day: date, job: str | None = None) -> list[dict[str, Any]]:
        """What suppressed duplicates would have cost from ``day`` on, as plain rows."""
        return self._ledger._read(sv.read_saved_since, day, job)

    def release_over_budget(self, claim: Claim, error: str) -> None:
        """Give back a Run whose model call the budget refused: pending, its attempt returned
        (see ``release_over_budget_txn``); ``LeaseLost`` if this claim no longer holds it."""
        if not self._ledger._write(faults.AFTER_RELEASE_OVER_BUDGET_COMMIT,
                                   budgets.release_over_budget_txn, claim.run_id, claim.fence,
                                   claim.owner, claim.attempt_id, error_text(error)):
            raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} no "
                            "longer holds it; nothing was released")

    def budget_windows(self, job: str, since: datetime) -> list[BudgetWindow]:
        """A job's budget windows from ``since`` on."""
        return self._ledger._read(budgets.list_windows, job, since)
