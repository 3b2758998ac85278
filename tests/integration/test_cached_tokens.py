"""Cached prompt tokens in the ledger, on both dialects: migration 0014 adds them to the model
call records (the calls made before read as not reported) and removes them on downgrade; a
job on an Anthropic endpoint records the cache reads and writes its answer reported, priced
apart, and `runledger runs show` and `runledger costs` show them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from typer.testing import Result

from store import Ledger, RunIdentity
from tests.support.anthropic_server import AnthropicServer, Reply
from tests.support.ledger import claim_of
from tests.support.pipeline import Env, outcomes, probe_job

PERIOD = datetime(2026, 12, 2, tzinfo=UTC)
# USD per million tokens: input 3, cache reads 0.30, cache writes 3.75, output 15.
PRICES = {"claude-probe": {"input": "3", "cached_input": "0.30", "cache_write": "3.75",
                           "output": "15"}}
USAGE = {"input_tokens": 50, "output_tokens": 20, "cache_read_input_tokens": 900,
         "cache_creation_input_tokens": 300}
COST = 50 * 3000 + 900 * 300 + 300 * 3750 + 20 * 15000  # nanos


def model_call_columns(ledger: Ledger) -> set[str]:
    return {c["name"] for c in sa.inspect(ledger.engine).get_columns("model_calls")}


def test_migration_0014_adds_the_cached_tokens_and_keeps_the_calls_made_before(
        empty_db_url: str) -> None:
    """A call recorded at 0013 reads, after 0014, as one whose provider reported no cache
    use (NULL, never 0); downgrading to 0013 removes both columns and keeps the call."""
    from alembic import command
    from alembic.config import Config

    from store.ledger import MIGRATIONS

    with Ledger.connect(empty_db_url) as ledger:
        ledger.migrate("0013")
        assert "cached_tokens" not in model_call_columns(ledger)
        claim = claim_of(ledger, RunIdentity("cached", "acme", PERIOD, "v1"),
                         lease=timedelta(minutes=5))
        with ledger.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO model_calls (call_id, run_id, attempt_id, fence, job, endpoint, "
                "model, position, prompt_digest, started_at, outcome, prompt_tokens, "
                "completion_tokens) VALUES ('c1', :run, :attempt, 1, 'cached', 'e', 'm', 0, "
                "'d', :now, 'answered', 120, 30)"),
                {"run": claim.run_id, "attempt": claim.attempt_id,
                 "now": PERIOD.replace(tzinfo=None)})
        ledger.migrate()
        [call] = ledger.calls.of_run(claim.run_id)
        assert (call.prompt_tokens, call.cached_tokens, call.cache_write_tokens) == (
            120, None, None)
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with ledger.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0013")
        assert {"cached_tokens", "cache_write_tokens"}.isdisjoint(model_call_columns(ledger))
        with ledger.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM model_calls")).scalar() == 1


@pytest.fixture
def anthropic_server(env: Env) -> Iterator[AnthropicServer]:
    """An Anthropic-compatible server on loopback, selected through RUNLEDGER_MODEL=anthropic,
    with the prices of its model's cache reads and writes."""
    with AnthropicServer() as server:
        env.set(model="anthropic", model_base_url=server.base_url, model_name="claude-probe",
                model_api_key="sk-ant-test", model_currency="USD",
                model_prices=json.dumps(PRICES))
        yield server


def test_a_job_on_an_anthropic_endpoint_records_and_prices_its_cached_tokens(
        env: Env, anthropic_server: AnthropicServer,
        invoke: Callable[..., Result]) -> None:
    """The transform's call goes through the Anthropic client; the ledger records the prompt's
    tokens (cache reads and writes included), each part priced at its own price, and
    `runs show` lists the cached and cache-write tokens with the call, `costs` with the job."""
    anthropic_server.script.append(Reply(text="Acme launched X1.", usage=USAGE))
    probe = probe_job(["acme"])
    state, report = env.run(probe.name, None, "2026-01-05")
    assert state.name == "Completed" and outcomes(report) == {"acme": "new"}
    [run] = env.ledger.runs(job=probe.name)
    [call] = env.ledger.calls.of_run(run.run_id)
    assert (call.prompt_tokens, call.completion_tokens) == (1250, 20)
    assert (call.cached_tokens, call.cache_write_tokens) == (900, 300)
    assert (call.cost_nanos, call.currency) == (COST, "USD")
    assert anthropic_server.requests[0]["path"] == "/v1/messages"
    shown = invoke("runs", "show", run.run_id, env={"COLUMNS": "220"}).stdout
    assert "1250 (900 cached, 300 cache write)" in shown
    assert "1270 tokens (900 cached, 300 cache write), 0.001845 USD" in shown
    costs = invoke("costs", "--job", probe.name, env={"COLUMNS": "220"}).stdout
    assert (f"{probe.name}: of its prompt tokens, 900 cached, 300 cache write (the provider's "
            "prompt cache, priced apart)") in costs
