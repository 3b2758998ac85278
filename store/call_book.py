"""The ledger's model calls and budgets (``Ledger.calls``): each method is one unit of work
around one transition of ``store.model_calls`` or ``store.budgets``, followed by its fault
point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import date, datetime
from typing import Any

from store import budgets, faults
from store import endpoint_limits as el
from store import model_calls as mc
from store.errors import LeaseLost
from store.lease import Claim
from store.models import BudgetWindow, EndpointLimit, ModelCall
from store.units_of_work import UnitsOfWork
from store.validators import error_text, json_document


class CallBook:
    """Every model call of the ledger's Runs, recorded before it leaves, and the budgets they
    reserve against (``Ledger.calls``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def record_intent(self, claim: Claim, intent: mc.Intent,
                      taken: el.Acquisition | None = None) -> mc.InFlight:
        """Record the call in flight (reserving its budget charge first, if any) before it
        leaves, carrying the endpoint slot ``taken`` for it by ``take_slot``, if any;
        ``LeaseLost`` if the Attempt no longer holds the Run (its fence moved on);
        ``BudgetExhausted`` (nothing reserved, the refusal counted) if a window has no room."""
        write = self._ledger._write
        try:
            flight = (write(faults.AFTER_CALL_INTENT_COMMIT, mc.record_intent_txn, claim, intent)
                      if intent.charge is None else
                      write(faults.AFTER_CALL_INTENT_COMMIT, mc.reserve_and_record_intent_txn,
                            claim, intent))
        except budgets.BudgetExhausted as exc:
            assert intent.charge is not None  # only a charge is refused
            refusal, first = write(faults.AFTER_REFUSE_BUDGET_COMMIT, budgets.refuse_txn,
                                   exc.refusal, intent.charge)
            raise budgets.BudgetExhausted(str(exc), refusal, first) from None
        return flight if taken is None else replace(flight, taken=taken)

    def take_slot(self, taken: el.Acquisition) -> el.Throttle:
        """Take a call's slot of an endpoint that does not bound its calls in flight, or the
        Throttle that says how long to wait; the call is then recorded by ``record_intent``
        (a slot taken for a call never recorded only leaves its endpoint a request early)."""
        return self._ledger._write(faults.AFTER_TAKE_SLOT_COMMIT, el.take_slot_txn, taken)

    def record_intent_when_allowed(self, claim: Claim, intent: mc.Intent,
                                   taken: el.Acquisition) -> mc.InFlight | el.Throttle:
        """As ``record_intent``, once the limits of an endpoint that bounds its calls in flight
        allow the call: in the same transaction its slot is taken, or the Throttle that says
        how long to wait is returned (nothing recorded, nothing reserved)."""
        write = self._ledger._write
        try:
            return write(faults.AFTER_CALL_INTENT_COMMIT, mc.acquire_and_record_intent_txn,
                         claim, intent, taken)
        except budgets.BudgetExhausted as exc:
            assert intent.charge is not None  # only a charge is refused
            refusal, first = write(faults.AFTER_REFUSE_BUDGET_COMMIT, budgets.refuse_txn,
                                   exc.refusal, intent.charge)
            raise budgets.BudgetExhausted(str(exc), refusal, first) from None

    def configure_endpoint(self, name: str, limits: el.Limits) -> None:
        """Create the endpoint's shared limits, or replace what is configured (a tick does as
        it starts; the same configuration keeps the adaptive rate learned so far)."""
        # The fault points are the call's own: the limits' writes ride beside its records.
        self._ledger._write(faults.AFTER_CALL_INTENT_COMMIT, el.configure_txn, name, limits)

    def endpoint_refused(self, call: mc.InFlight, pause_seconds: float | None,
                         max_pause_seconds: float) -> datetime | None:
        """The provider refused the call (a 429): pause its endpoint for every worker for
        ``pause_seconds`` (None: a backoff), at most ``max_pause_seconds``; until when."""
        if call.taken is None:
            return None
        return self._ledger._write(faults.AFTER_CALL_FAILURE_COMMIT, el.refuse_txn,
                                   call.taken.endpoint, call.taken.tokens, pause_seconds,
                                   max_pause_seconds)

    def endpoint_answered(self, call: mc.InFlight, usage: mc.Usage) -> None:
        """Settle the tokens the call took of its endpoint to what it used (its estimate when
        the provider reported none), and raise the endpoint's rate by a step."""
        if call.taken is not None:
            used = usage.tokens if usage.prompt_tokens is not None else call.taken.tokens
            self._ledger._write(faults.AFTER_CHECKPOINT_COMMIT, el.answered_txn,
                                call.taken.endpoint, call.taken.tokens, used)

    def endpoint_limit(self, name: str) -> EndpointLimit | None:
        """The endpoint's limits and their state, if it has any."""
        return self._ledger._read(el.read_limit, name)

    def record_answer(self, call: mc.InFlight, answer: dict[str, Any], usage: mc.Usage) -> None:
        """Record the call answered with its usage and checkpoint its answer, in one commit;
        ``LeaseLost`` (after recording the usage) if the Attempt's lease had ended."""
        answer = json_document(answer, "model answer", self._ledger.max_output_bytes)
        txn = mc.record_answer_txn if call.charge is None else mc.record_answer_and_settle_txn
        checkpointed = self._ledger._write(faults.AFTER_CHECKPOINT_COMMIT, txn, call, answer,
                                           usage)
        if not checkpointed:
            raise LeaseLost(f"run {call.claim.run_id}: the lease of fence {call.claim.fence} "
                            "ended while the model answered; the call is recorded lost")

    def record_failure(self, call: mc.InFlight, outcome: str, error: str,
                       usage: mc.Usage = mc.NO_USAGE) -> None:
        """Record the call refused (the provider's error reply) or failed (no usable answer)."""
        txn = mc.record_failure_txn if call.charge is None else mc.record_failure_and_release_txn
        self._ledger._write(faults.AFTER_CALL_FAILURE_COMMIT, txn, call, outcome, error, usage)

    def mark_lost(self, run_id: str) -> list[str]:
        """Mark lost the Run's calls in flight whose Attempt no longer holds the Run."""
        return self._ledger._write(faults.AFTER_MARK_LOST_COMMIT, mc.mark_lost_txn, run_id)

    def replay(self, claim: Claim, position: int, prompt_digest: str) -> mc.Checkpoint | None:
        """The checkpointed answer of this position for the same prompt, counted as reused."""
        return self._ledger._write(faults.AFTER_REPLAY_COMMIT, mc.replay_txn,
                                   claim, position, prompt_digest)

    def reject_answers(self, claim: Claim) -> list[str]:
        """Validation rejected the candidate: its answers are never replayed."""
        return self._ledger._write(faults.AFTER_REJECT_ANSWERS_COMMIT, mc.reject_answers_txn,
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
            self._ledger._write(faults.AFTER_COUNT_SAVED_COMMIT, mc.count_saved_txn,
                                job, day, run_ids)

    def saved_since(self, day: date, job: str | None = None) -> list[dict[str, Any]]:
        """What suppressed duplicates would have cost from ``day`` on, as plain rows."""
        return self._ledger._read(mc.read_saved_since, day, job)

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
