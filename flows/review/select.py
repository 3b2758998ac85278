"""Which held messages a decision names: message ids (or unique prefixes), one Run, or a job's
period; the same choice for the CLI and the review-outbox flow."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flows.registry import get_job
from store import HeldMessage, InvalidInput, Ledger


@dataclass(frozen=True)
class Selection:
    """What a decision names: ``ids``, or a ``run``, or a ``job`` and ``period`` (its label)."""

    ids: Sequence[str] = ()
    run: str | None = None
    job: str | None = None
    period: str | None = None

    def describe(self) -> str:
        if self.run:
            return f"run {self.run}"
        if self.job:
            return f"job {self.job}" + (f" period {self.period}" if self.period else "")
        return "the given ids" if self.ids else "every job"


def held_messages(ledger: Ledger, job: str | None = None, period: str | None = None,
                  run: str | None = None) -> list[HeldMessage]:
    """The messages waiting for a decision, of one job (and one of its periods) or one Run."""
    if period is not None and job is None:
        raise InvalidInput("--period needs --job: a period is counted in its job's cadence")
    run_id = ledger.resolve_run_id(run) if run else None
    start = get_job(job).parse_period(period).start if job and period else None
    return ledger.outbox.held(job=job, period_start=start, run_id=run_id)


def selected_ids(ledger: Ledger, chosen: Selection) -> list[str]:
    """The ids of the messages ``chosen`` names: exactly one way of naming them is allowed,
    and a Run or period with no held message is an error (nothing to decide)."""
    ways = [bool(chosen.ids), chosen.run is not None, chosen.job is not None]
    if sum(ways) != 1:
        raise InvalidInput("name the messages one way: message ids, or --run RUN, or --job JOB "
                           "--period PERIOD")
    if chosen.ids:
        return [ledger.outbox.resolve_message_id(i) for i in chosen.ids]
    if chosen.job is not None and chosen.period is None:
        raise InvalidInput("--job needs --period (a date such as 2026-12-05): a decision names "
                           "one period's messages")
    found = held_messages(ledger, chosen.job, chosen.period, chosen.run)
    if not found:
        raise InvalidInput(f"{chosen.describe()} has no held message: nothing to decide "
                           "(`runledger outbox held` lists them)")
    return [h.message.message_id for h in found]
