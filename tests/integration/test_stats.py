"""`runledger stats` on both ledgers: per job and UTC day, logical Runs completed apart from the
attempts they took and revisions apart from both, lease takeovers, duplicates suppressed, model
calls paid, lost and reused with their tokens and cost, and outbox messages; bad input is a
one-line error that writes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.stats import daily_stats
from store import Claim, Intent, InvalidInput, Ledger, OutboxMessage, RunIdentity, Usage
from tests.support.ledger import register_and_claim, snapshot, wait_for_db_clock

PERIOD = datetime(2026, 1, 5, tzinfo=UTC)


def identity(subject: str, job: str = "digest") -> RunIdentity:
    return RunIdentity(job, subject, PERIOD, "1")


DIGEST = "0" * 64


def answered(ledger: Ledger, claim: Claim, cost: int | None = 4_500) -> None:
    """One model call of 100 + 20 tokens, answered (``cost`` in billionths of USD)."""
    call = ledger.calls.record_intent(claim, Intent("loopback", "m", 0, DIGEST))
    ledger.calls.record_answer(call, {"text": "t"}, Usage(100, 20, 7, cost,
                                                          None if cost is None else "USD"))


def a_day_of_activity(ledger: Ledger) -> None:
    """Today: team-a completes in one attempt (1 call, 2 messages) and is revised (1 call);
    team-b's first worker stalls with its call in flight, a second takes the lease over and
    completes (2 calls paid, 1 of them lost; 1 message); two ticks find Runs already completed
    or held."""
    first = register_and_claim(ledger, identity("team-a"), owner="w:1", lease=600).claim
    assert first is not None
    answered(ledger, first)
    ledger.complete(first, {"text": "a"}, [OutboxMessage("a@example.com", "A", "a"),
                                           OutboxMessage("b@example.com", "A", "a")])
    revision = ledger.request_revision(first.run_id, "new prompt").run
    again = ledger.claim(revision.run_id, "w:1", 600)
    assert again is not None
    answered(ledger, again, cost=None)
    ledger.complete(again, {"text": "a2"})
    stalled = register_and_claim(ledger, identity("team-b"), owner="w:1", lease=0.2).claim
    assert stalled is not None
    ledger.calls.record_intent(stalled, Intent("loopback", "m", 0, DIGEST))
    wait_for_db_clock(ledger, stalled.lease_expires_at)
    taken = ledger.claim(stalled.run_id, "w:2", 600)
    assert taken is not None
    ledger.calls.mark_lost(taken.run_id)
    answered(ledger, taken)
    ledger.complete(taken, {"text": "b"}, [OutboxMessage("c@example.com", "B", "b")])
    today = ledger.now().date()
    ledger.count_suppressed("digest", today, 2, 0)
    ledger.count_suppressed("digest", today, 1, 1)


def midnight(ledger: Ledger) -> datetime:
    return datetime.combine(ledger.now().date(), time(0), UTC)


def test_a_days_stats_count_runs_apart_from_attempts_takeovers_and_what_was_suppressed(
        ledger: Ledger) -> None:
    """Two logical Runs completed and one revision apart, four attempts (one Run took two: one
    takeover), four model calls paid (one lost in flight; the revision's unpriced), three
    messages queued and the two ticks' suppressed counts added up."""
    a_day_of_activity(ledger)
    since = midnight(ledger)
    [day] = daily_stats(ledger.activity(since, "digest"), since,
                        ledger.calls.since(since, "digest"))
    assert (day.job, day.day) == ("digest", since.date())
    assert (day.completed, day.revised, day.attempts) == (2, 1, 4)
    assert dict(day.attempts_per_completed) == {1: 1, 2: 1}
    assert (day.lease_takeovers, day.model_calls) == (1, 4)
    assert (day.spend.paid, day.spend.lost, day.spend.tokens) == (3, 1, 240)
    assert day.spend.money() == "0.000009 USD + 1 call of unknown cost"
    assert (day.revision_spend.paid, day.revision_spend.money()) == (1, "no price")
    assert (day.duplicates, day.in_progress_elsewhere) == (3, 1)
    assert dict(day.messages) == {"pending": 3}


def test_stats_of_one_job_leave_the_others_out(ledger: Ledger) -> None:
    """`--job` filters every count, the suppressed ones too."""
    a_day_of_activity(ledger)
    other = register_and_claim(ledger, identity("team-c", job="other"), owner="w:1",
                               lease=600).claim
    assert other is not None
    ledger.complete(other, {"text": "c"})
    ledger.count_suppressed("other", ledger.now().date(), 5, 0)
    since = midnight(ledger)
    assert [(d.job, d.completed, d.duplicates)
            for d in daily_stats(ledger.activity(since), since, ledger.calls.since(since))] == [
        ("digest", 2, 3), ("other", 1, 5)]
    assert [d.job for d in daily_stats(ledger.activity(since, "other"), since)] == ["other"]


def test_a_negative_suppressed_count_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    """A count is 0 or more: -1 is a clear error and no count row appears."""
    since = midnight(ledger)
    with pytest.raises(InvalidInput, match="duplicates must be an integer of 0 or more"):
        ledger.count_suppressed("digest", since.date(), -1, 0)
    assert ledger.activity(since).suppressed == []


def test_stats_json_gives_each_job_and_day_from_since(cli: CliRunner, ledger: Ledger) -> None:
    """`runledger stats --since TODAY --json` carries the day's numbers; a later --since
    none."""
    a_day_of_activity(ledger)
    today = ledger.now().date()
    shown = cli.invoke(app, ["stats", "--since", today.isoformat(), "--json"],
                       catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    [day] = json.loads(shown.output)
    spend, revision_spend = day.pop("spend"), day.pop("revision_spend")
    assert day == {"job": "digest", "day": today.isoformat(), "completed": 2, "revised": 1,
                   "attempts": 4, "attempts_per_completed": {"1": 1, "2": 1},
                   "lease_takeovers": 1, "duplicates": 3, "in_progress_elsewhere": 1,
                   "model_calls": 4, "messages": {"pending": 3}}
    assert (spend["calls_paid"], spend["calls_lost"], spend["tokens"]) == (3, 1, 240)
    assert spend["cost"] == {"USD": "0.000009"} and spend["calls_of_unknown_cost"] == 1
    assert (revision_spend["calls_paid"], revision_spend["cost"]) == (1, {})
    table = cli.invoke(app, ["stats"], catch_exceptions=False, env={"COLUMNS": "220"}).output
    assert "digest" in table and "1 in 1, 1 in 2" in table and "3 pending" in table
    assert "0.000009 USD" in table and "unknown cost" in " ".join(table.split())
    later = cli.invoke(app, ["stats", "--since", "2999-01-01"], catch_exceptions=False)
    assert "nothing recorded since 2999-01-01" in later.output


@pytest.mark.parametrize("args, message", [
    (["--since", "last week"], "--since must be a day as YYYY-MM-DD (UTC), such as"),
    (["--since", "2026-13-01"], "--since must be a day as YYYY-MM-DD (UTC), such as"),
    (["--job", "no-such-job"], "unknown job 'no-such-job'; registered jobs:"),
])
def test_bad_stats_input_is_a_one_line_error_that_writes_nothing(
        cli: CliRunner, ledger: Ledger, args: list[str], message: str) -> None:
    """A bad day or an unknown job: exit status 1, an error naming it (no traceback), nothing
    written."""
    before = snapshot(ledger)
    shown = cli.invoke(app, ["stats", *args], catch_exceptions=False)
    assert shown.exit_code == 1
    assert shown.output.startswith("error: ") and message in shown.output.replace("\n", "")
    assert snapshot(ledger) == before
