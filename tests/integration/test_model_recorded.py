"""The recording wrapper a transform receives, on both ledgers against a real OpenAI-compatible
server on loopback: each call is recorded before it leaves with the usage the server reported
and its cost; a later attempt replays the checkpointed answers of the calls it repeats; refusals
and failures are recorded as such; prices come from settings or a Prefect block."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flows.model import (
    CallCount,
    ModelPrices,
    ModelRejected,
    ModelUnavailable,
    OfflineModel,
    RecordedModel,
    prices_from_settings,
)
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.prices import ModelPrice, PriceList, format_money
from flows.settings import RunledgerSettings
from flows.spend import spend_of
from store import Claim, Ledger, RunIdentity
from tests.support.ledger import claim_of, wait_for_db_clock
from tests.support.pipeline import ModelServer, Reply

PERIOD = datetime(2026, 12, 2, tzinfo=UTC)
PRICES = PriceList(currency="USD", prices={"probe-model": ModelPrice(input=Decimal("0.15"),
                                                                        output=Decimal("0.60"))})
COST = 120 * 150 + 30 * 600  # nanos: 120 prompt tokens at 0.15/M, 30 completion at 0.60/M


def claimed(ledger: Ledger, lease: timedelta = timedelta(minutes=15)) -> Claim:
    return claim_of(ledger, RunIdentity("recorded", "acme", PERIOD, "v1"), lease=lease)


def recorded(server: ModelServer, ledger: Ledger, claim: Claim,
             prices: PriceList = PRICES, timeout: float = 10.0) -> RecordedModel:
    inner = OpenAICompatibleModel(server.base_url, "probe-model", timeout_seconds=timeout)
    return RecordedModel(inner, ledger.calls, claim, prices, CallCount())


def assert_records_are_the_ledgers(model: RecordedModel, ledger: Ledger) -> None:
    """What the attempt kept of the calls it recorded adds up as the ledger's records do (a
    Run completed at fence 1 reports its spend from them, without reading them back)."""
    stored = [c.model_dump() for c in ledger.calls.of_run(model.claim.run_id)]
    assert spend_of(model.spent.records).as_dict() == spend_of(stored).as_dict()


def two_calls(model: RecordedModel) -> tuple[str, str]:
    """A transform that summarizes, then classifies the summary."""
    summary = model.generate("the documents", system="Summarize.").text
    return summary, model.generate(f"classify: {summary}").text


def test_each_call_is_recorded_with_the_usage_the_server_reported_and_its_cost(
    server: ModelServer, ledger: Ledger,
) -> None:
    """Two calls, two answered records at positions 0 and 1, with tokens, latency and cost."""
    claim = claimed(ledger)
    model = recorded(server, ledger, claim)
    assert two_calls(model) == ("answer 1", "answer 2")
    calls = ledger.calls.of_run(claim.run_id)
    assert [(c.position, c.outcome) for c in calls] == [(0, "answered"), (1, "answered")]
    assert all((c.prompt_tokens, c.completion_tokens) == (120, 30) for c in calls)
    assert all(c.cost_nanos == COST and c.currency == "USD" for c in calls)
    assert all(c.latency_ms is not None and c.endpoint == server.base_url for c in calls)
    assert (model.spent.made, model.spent.tokens, model.spent.cost_nanos) == (2, 300, 2 * COST)
    assert_records_are_the_ledgers(model, ledger)


def test_a_model_without_a_price_shows_its_tokens_and_no_price(
    server: ModelServer, ledger: Ledger,
) -> None:
    """No price for the model: tokens recorded, cost unknown (not zero)."""
    claim = claimed(ledger)
    recorded(server, ledger, claim, PriceList()).generate("x")
    [call] = ledger.calls.of_run(claim.run_id)
    assert (call.prompt_tokens, call.cost_nanos, call.currency) == (120, None, None)
    assert format_money(call.cost_nanos, call.currency) == "no price"


def test_a_repeated_transform_replays_the_answers_it_checkpointed_and_calls_only_the_rest(
    server: ModelServer, ledger: Ledger,
) -> None:
    """The first attempt's second call is refused (503); the next attempt replays the first
    answer from its checkpoint and pays only for the second call."""
    first = claimed(ledger, lease=timedelta(seconds=1))
    server.script.extend([Reply(), Reply(503)])
    with pytest.raises(ModelUnavailable):
        two_calls(recorded(server, ledger, first))
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, "w:2", timedelta(minutes=15))
    assert second is not None
    again = recorded(server, ledger, second)
    assert two_calls(again) == ("answer 1", "answer 3")
    assert len(server.requests) == 3
    assert (again.spent.made, again.spent.reused) == (1, 1)
    calls = ledger.calls.of_run(first.run_id)
    assert [(c.fence, c.position, c.outcome) for c in calls] == [
        (1, 0, "answered"), (1, 1, "refused"), (2, 1, "answered")]
    assert calls[0].reuses == 1


def test_a_changed_prompt_is_not_replayed(server: ModelServer, ledger: Ledger) -> None:
    """The checkpoint is found by position AND prompt digest: another prompt calls again."""
    first = claimed(ledger, lease=timedelta(seconds=1))
    recorded(server, ledger, first).generate("old prompt")
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, "w:2", timedelta(minutes=15))
    assert second is not None
    assert recorded(server, ledger, second).generate("new prompt").text == "answer 2"


def test_refusals_and_failures_are_recorded_as_such(server: ModelServer, ledger: Ledger) -> None:
    """429 and 400 are refused (the provider answered: not billed); a timeout and a malformed
    reply are failed (no usable answer: maybe billed)."""
    claim = claimed(ledger)
    # Answers within 2 s on a loaded machine; the slow one's 6 s never does.
    model = recorded(server, ledger, claim, timeout=2.0)
    server.script.extend([Reply(429), Reply(400), Reply(delay=6.0), Reply(raw=b"not json")])
    for error in (ModelUnavailable, ModelRejected, ModelUnavailable, ModelRejected):
        with pytest.raises(error):
            model.generate("x")
    assert [c.outcome for c in ledger.calls.of_run(claim.run_id)] == [
        "refused", "refused", "failed", "failed"]
    assert_records_are_the_ledgers(model, ledger)


def test_the_offline_model_reports_words_as_its_usage(ledger: Ledger) -> None:
    """The offline model counts whitespace-separated words, system text included."""
    claim = claimed(ledger)
    count = CallCount()
    model = RecordedModel(OfflineModel(max_sentences=1), ledger.calls, claim, PriceList(), count)
    answer = model.generate("Acme cut prices. Acme hired staff.", system="Be brief.")
    assert (answer.prompt_tokens, answer.completion_tokens) == (8, 3)
    [call] = ledger.calls.of_run(claim.run_id)
    assert (call.endpoint, call.model, call.prompt_tokens) == ("offline", "offline-extractive-v1", 8)


def test_prices_come_from_a_prefect_block_the_ui_can_edit(prefect_api: str) -> None:
    """RUNLEDGER_MODEL_PRICES_BLOCK names a saved "runledger model prices" block."""
    ModelPrices(currency="eur", prices={"m": ModelPrice(input=Decimal(1), output=Decimal(2))}
                ).save("runledger-test-prices", overwrite=True)
    prices = prices_from_settings(RunledgerSettings(model_prices_block="runledger-test-prices"))
    assert prices.currency == "EUR"
    assert prices.cost_nanos("m", 1_000_000, 500_000) == 2 * 10**9
