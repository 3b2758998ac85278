"""`runledger costs` on both ledgers: what a job spent (calls paid, lost, reused, tokens, money;
revisions apart) and what the duplicates the ledger suppressed would have cost, equal to the
duplicates' own stored cost; bad input is a one-line error."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from typer.testing import CliRunner

from flows.cli import app
from store import Claim, Intent, Ledger, RunIdentity, Usage
from tests.support.ledger import register_and_claim, wait_for_db_clock

WEEK = [datetime(2026, 11, 23, tzinfo=UTC) + timedelta(days=n) for n in range(7)]
DIGEST = "1" * 64


def completed_with_a_call(ledger: Ledger, period: datetime, cost: int) -> Claim:
    claim = register_and_claim(ledger, RunIdentity("weekly", "acme", period, "1"), owner="w:1",
                                      lease=600).claim
    assert claim is not None
    call = ledger.calls.record_intent(claim, Intent("loopback", "m", 0, DIGEST))
    ledger.calls.record_answer(call, {"text": "t"}, Usage(1000, 200, 9, cost, "EUR"))
    ledger.complete(claim, {"text": "t"})
    return claim


def a_week_with_reruns(ledger: Ledger) -> int:
    """Seven daily Runs of different cost; each is asked for again by as many reruns as its
    day's number (0 to 6): the duplicates' stored cost, in billionths of EUR."""
    today = ledger.now().date()
    expected = 0
    for n, period in enumerate(WEEK):
        cost = 1_000_000 * (n + 1)
        claim = completed_with_a_call(ledger, period, cost)
        for _ in range(n):  # a rerun tick finds the Run completed: one duplicate
            ledger.count_suppressed("weekly", today, 1, 0)
            ledger.calls.count_saved("weekly", today, [claim.run_id])
            expected += cost
    return expected


def test_costs_say_what_a_week_spent_and_what_its_suppressed_duplicates_would_have_cost(
    cli: CliRunner, ledger: Ledger,
) -> None:
    """Saved equals the sum of each duplicate Run's stored cost: 21 duplicates, measured."""
    expected = a_week_with_reruns(ledger)
    shown = cli.invoke(app, ["costs", "--since", ledger.now().date().isoformat(), "--json"],
                       catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    [job] = json.loads(shown.output)["jobs"]
    assert job["job"] == "weekly" and job["duplicates_suppressed"] == 21
    assert job["spent"]["calls_paid"] == 7 and job["spent"]["tokens"] == 7 * 1200
    assert job["spent"]["cost"] == {"EUR": str(Decimal(28_000_000) / 10**9)}
    assert job["saved"]["cost"] == {"EUR": str(Decimal(expected) / 10**9)}
    assert job["saved"]["calls"] == 21 and job["saved"]["tokens"] == 21 * 1200
    table = cli.invoke(app, ["costs"], catch_exceptions=False, env={"COLUMNS": "200"}).output
    assert "weekly" in table and "0.028000 EUR" in table and "0.112000 EUR" in table


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "--since must be a day as YYYY-MM-DD (UTC), such as"),
    (["--job", "no-such-job"], "unknown job 'no-such-job'; registered jobs:"),
])
def test_bad_costs_input_is_a_one_line_error(cli: CliRunner, ledger: Ledger, args: list[str],
                                             message: str) -> None:
    """A malformed day or an unknown job: exit 1 and one line naming the fix."""
    shown = cli.invoke(app, ["costs", *args])
    assert shown.exit_code == 1 and message in " ".join(shown.output.split())


def test_runs_show_lists_each_call_of_each_attempt_with_its_usage_and_cost(
    cli: CliRunner, ledger: Ledger,
) -> None:
    """A Run whose first Attempt died with a call in flight, whose second Attempt's answer was
    checkpointed, and whose third replayed it: 2 paid, 1 lost, 1 reused."""
    first = register_and_claim(ledger, RunIdentity("weekly", "globex", WEEK[0], "1"),
                                      owner="w:1", lease=0.2).claim
    assert first is not None
    ledger.calls.record_intent(first, Intent("loopback", "m", 0, DIGEST))
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, "w:2", 0.5)
    assert second is not None
    ledger.calls.mark_lost(first.run_id)
    call = ledger.calls.record_intent(second, Intent("loopback", "m", 0, DIGEST))
    ledger.calls.record_answer(call, {"text": "t", "model": "m"}, Usage(1000, 200, 9, 450_000, "EUR"))
    wait_for_db_clock(ledger, second.lease_expires_at)
    third = ledger.claim(first.run_id, "w:3", 600)
    assert third is not None and ledger.calls.replay(third, 0, DIGEST) is not None
    ledger.complete(third, {"text": "t"})
    shown = cli.invoke(app, ["runs", "show", first.run_id[:12]], catch_exceptions=False,
                       env={"COLUMNS": "200"})
    text = " ".join(shown.output.split())
    assert "model calls: 2 paid, 1 lost, 1 reused, 1200 tokens" in text
    assert "(in flight)" not in text and "lost" in text and "0.000450 EUR" in text
    as_json = json.loads(cli.invoke(app, ["runs", "show", first.run_id, "--json"]).output)
    assert [c["outcome"] for c in as_json["model_calls"]] == ["lost", "answered"]
    assert as_json["spend"]["calls_reused"] == 1
