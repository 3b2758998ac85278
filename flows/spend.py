"""What jobs spend, from the ledger's model call records: calls paid (answered, failed, lost:
every call that left and may have been billed), lost in flight, refused (the provider's error
reply: not billed), answers reused from a checkpoint, tokens (of the prompts', those read from
the provider's prompt cache and written to it), and cost per currency (a call
without a price counts its tokens and shows "no price"), answers billed beyond the bound their
call reserved (a provider that did not honour max_tokens); and what the duplicates the ledger
suppressed would have cost, measured as each duplicate Run's answered calls' stored cost."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from flows.prices import format_money, money
from store import WITHDRAWN

PAID = frozenset({"answered", "failed", "lost"})


@dataclass
class Spend:
    """Model calls added up."""

    paid: int = 0
    lost: int = 0
    failed: int = 0
    refused: int = 0
    in_flight: int = 0
    queued: int = 0  # calls queued for a provider's batch, not yet settled (not paid yet)
    reused: int = 0
    tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the provider's prompt cache
    cache_write_tokens: int = 0  # prompt tokens written to it
    cost: Counter[str] = field(default_factory=Counter)  # currency: billionths
    unpriced: int = 0  # paid calls whose usage is known and whose model has no price
    unknown: int = 0  # paid calls whose usage never reached the ledger (lost, failed)
    overran: int = 0  # answers billed beyond their call's bound
    overrun_tokens: int = 0  # the tokens billed beyond those bounds, together
    batched: int = 0  # paid calls settled through a provider's batch
    batch_saved: Counter[str] = field(default_factory=Counter)  # their saving, per currency

    def add(self, row: dict[str, Any]) -> None:
        """Add one model call record (a row of ``CallBook.since``, or a ``ModelCall``'s dict)."""
        outcome = row["outcome"]
        self.reused += row.get("reuses") or 0
        if outcome is None:
            self.in_flight += 1
            return
        if outcome == "queued":
            self.queued += 1
            return
        if outcome in ("refused", WITHDRAWN):
            self.refused += outcome == "refused"
            return
        self.paid += 1
        self.lost += outcome == "lost"
        self.failed += outcome == "failed"
        self.tokens += (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
        self.cached_tokens += row.get("cached_tokens") or 0
        self.cache_write_tokens += row.get("cache_write_tokens") or 0
        if row.get("overrun"):
            self.overran += 1
            self.overrun_tokens += row["overrun"]
        if row.get("batch_key"):
            self.batched += 1
            if row.get("sync_cost_nanos") is not None and row.get("cost_nanos") is not None:
                self.batch_saved[row["currency"]] += row["sync_cost_nanos"] - row["cost_nanos"]
        if row.get("cost_nanos") is not None and row.get("currency") is not None:
            self.cost[row["currency"]] += row["cost_nanos"]
        elif row.get("prompt_tokens") is None and row.get("completion_tokens") is None:
            self.unknown += 1
        else:
            self.unpriced += 1

    @property
    def unanswered(self) -> int:
        """Calls that left and whose answer never reached the ledger: lost in flight, failed,
        and those with no outcome yet (in flight; once their Attempt is gone, a killed
        worker's, lost until a later attempt of the Run marks them so)."""
        return self.lost + self.failed + self.in_flight

    def keeps_invariant(self, transform_calls: int = 1) -> bool:
        """Invariant 11 for one Run's calls: the calls that left (paid, and those with no
        outcome yet) are at most one transform's calls plus those never answered. A call with
        no outcome is on both sides, as the lost call it is once marked: never paid and not
        lost."""
        return self.paid + self.in_flight <= transform_calls + self.unanswered

    def money(self) -> str:
        """The cost for people: ``0.004500 EUR``, ``no price``, or both parts."""
        return cost_text(self.cost, self.unpriced, self.unknown)

    def as_dict(self) -> dict[str, Any]:
        return {"calls_paid": self.paid, "calls_lost": self.lost, "calls_failed": self.failed,
                "calls_refused": self.refused, "calls_in_flight": self.in_flight,
                "calls_queued": self.queued, "calls_batched": self.batched,
                "batch_saved": {c: str(money(n)) for c, n in sorted(self.batch_saved.items())},
                "calls_reused": self.reused, "tokens": self.tokens,
                "cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cost": {c: str(money(n)) for c, n in sorted(self.cost.items())},
                "calls_without_price": self.unpriced, "calls_of_unknown_cost": self.unknown,
                "calls_over_bound": self.overran, "tokens_over_bound": self.overrun_tokens}


def _calls(n: int) -> str:
    return f"{n} call{'s' if n != 1 else ''}"


def cost_text(cost: Counter[str] | dict[str, int], unpriced: int = 0, unknown: int = 0) -> str:
    """Costs per currency for people; calls without a price, or whose usage never reached the
    ledger (lost in flight, failed), said as such: never counted as free."""
    parts = [format_money(n, c) for c, n in sorted(cost.items())]
    if unpriced:
        parts.append("no price" if not parts and not unknown else
                     f"{_calls(unpriced)} with no price")
    if unknown:
        parts.append(f"{_calls(unknown)} of unknown cost")
    return " + ".join(parts) or "-"


def cache_text(cached: int | None, written: int | None) -> str:
    """Prompt tokens read from the provider's cache and written to it, for people:
    ``900 cached, 300 cache write``; empty when neither."""
    return ", ".join(f"{n} {what}" for n, what in ((cached, "cached"), (written, "cache write"))
                     if n)


def spend_of(calls: list[dict[str, Any]]) -> Spend:
    """The calls of one Run (or any list) added up."""
    total = Spend()
    for row in calls:
        total.add(row)
    return total


@dataclass
class DaySpend:
    """One job's UTC day: the calls of its Runs and, apart, of its revisions."""

    job: str
    day: date
    runs: Spend = field(default_factory=Spend)
    revisions: Spend = field(default_factory=Spend)


def daily_spend(calls: list[dict[str, Any]], since: datetime) -> dict[tuple[str, date], DaySpend]:
    """The calls started from the UTC day of ``since`` on, per job and UTC day of their start."""
    days: dict[tuple[str, date], DaySpend] = {}
    for row in calls:
        day = row["started_at"].date()
        if day < since.date():
            continue
        found = days.setdefault((row["job"], day), DaySpend(row["job"], day))
        (found.revisions if row.get("revision") else found.runs).add(row)
    return days


@dataclass
class JobCosts:
    """What one job spent from a day on, and what the ledger saved it."""

    job: str
    spent: Spend = field(default_factory=Spend)
    revisions: Spend = field(default_factory=Spend)
    duplicates: int = 0  # duplicate Runs suppressed
    saved: Counter[str] = field(default_factory=Counter)  # currency: billionths
    saved_tokens: int = 0
    saved_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "spent": self.spent.as_dict(),
                "revisions": self.revisions.as_dict(), "duplicates_suppressed": self.duplicates,
                "saved": {"calls": self.saved_calls, "tokens": self.saved_tokens,
                          "cost": {c: str(money(n)) for c, n in sorted(self.saved.items())}}}


def job_costs(calls: list[dict[str, Any]], saved: list[dict[str, Any]],
              duplicates: dict[str, int]) -> list[JobCosts]:
    """Per job: the calls' spend (revisions apart), the duplicates suppressed and what they
    would have cost (``saved``: rows of ``CallBook.saved_since``), by job name."""
    jobs: dict[str, JobCosts] = {}
    for row in calls:
        found = jobs.setdefault(row["job"], JobCosts(row["job"]))
        (found.revisions if row.get("revision") else found.spent).add(row)
    for row in saved:
        found = jobs.setdefault(row["job"], JobCosts(row["job"]))
        found.saved_calls += row["calls"]
        found.saved_tokens += row["tokens"]
        if row["currency"]:
            found.saved[row["currency"]] += row["cost_nanos"]
    for job, count in duplicates.items():
        jobs.setdefault(job, JobCosts(job)).duplicates += count
    return [jobs[name] for name in sorted(jobs)]
