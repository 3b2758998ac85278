"""A job's targets and endpoint are checked before its tick's first model call: a missing or
invalid block, an unknown endpoint, end the flow run NotReady (one line, no traceback) with
nothing written and no model call paid; `runledger run` refuses before any flow run exists."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from typer.testing import CliRunner

from flows.cli import app
from flows.jobs import Target
from flows.run_job.revision import revise
from flows.webhook.block import WebhookEndpoint
from tests.support.pipeline import Env, final_state, probe_job

PERIOD = "2026-01-05"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def targets() -> Iterator[list[Target]]:
    """A probe job's targets, emptied when the test ends: the registry outlives the test, and
    a registered job with a webhook or object target would fail a later `runledger check` of
    this process (its channels line)."""
    wanted: list[Target] = []
    yield wanted
    wanted.clear()


def flow_runs_named(name: str) -> int:
    async def count() -> int:
        async with get_client() as client:
            return len(await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))))
    return asyncio.run(count())


def test_a_missing_webhook_block_stops_the_tick_before_anything_is_written_or_paid(
        env: Env, targets: list[Target]) -> None:
    """A target naming an endpoint block that does not exist: the flow run ends Failed, named
    NotReady, with one line naming the block and the fix; no Run, no collect, no model call.
    Once the block exists, the same tick completes."""
    block = unique("absent-api")
    targets += [Target.email(), Target.webhook(block)]
    probe = probe_job(targets=lambda: list(targets))
    state, _ = env.run(probe.name, period=PERIOD)
    assert (state.type.value, state.name) == ("FAILED", "NotReady")
    message = state.message or ""
    assert "\n" not in message
    assert message == (
        f"job {probe.name} is not ready: the webhook endpoint block {block!r} does not exist; "
        "create it (see docs/how-to/outbox.md) or fix the job's targets and messages. Nothing "
        "was written and no model was called")
    assert env.ledger.runs(job=probe.name) == []
    assert (probe.collects, env.model_calls()) == ([], 0)
    WebhookEndpoint(url="http://127.0.0.1:9/in").save(block)  # loopback: plain http allowed
    again, _ = env.run(probe.name, period=PERIOD)
    assert again.is_completed(), again.message
    assert [r.status for r in env.ledger.runs(job=probe.name)] == ["completed"]


def test_a_plain_http_block_off_loopback_is_invalid_not_missing(
        env: Env, targets: list[Target]) -> None:
    """A block that exists but whose URL is plain http off loopback: InvalidBlock's words (what
    is wrong with it), not "does not exist"; nothing written."""
    block = unique("plain-api")
    WebhookEndpoint(url="http://hooks.example.com/in").save(block)
    targets.append(Target.webhook(block))
    probe = probe_job(targets=lambda: list(targets))
    state, _ = env.run(probe.name, period=PERIOD)
    assert (state.type.value, state.name) == ("FAILED", "NotReady")
    assert f"webhook endpoint {block!r} is invalid" in (state.message or "")
    assert "https unless the host is loopback" in (state.message or "")
    assert "does not exist" not in (state.message or "")
    assert env.ledger.runs(job=probe.name) == [] and env.model_calls() == 0


def test_a_missing_bucket_and_an_unknown_endpoint_are_named_together(
        env: Env, targets: list[Target]) -> None:
    """Every problem of the tick in its one line: the unknown endpoint (with the known ones)
    and the missing S3Bucket block."""
    bucket = unique("no-bucket")
    targets.append(Target.object(bucket))
    probe = probe_job(endpoint="nowhere", targets=lambda: list(targets))
    state, _ = env.run(probe.name, period=PERIOD)
    assert state.name == "NotReady"
    message = state.message or ""
    assert "no model endpoint named 'nowhere'; known endpoints: default" in message
    assert f"the S3Bucket block {bucket!r} does not exist" in message
    assert env.ledger.runs(job=probe.name) == [] and env.model_calls() == 0


def test_runledger_run_refuses_a_job_that_is_not_ready_with_exit_2_and_no_flow_run(
        env: Env) -> None:
    """`runledger run` of a job with an unknown endpoint: the one line on stderr, exit 2, no
    flow run on the server, no Run in the ledger."""
    probe = probe_job(endpoint="nowhere")
    result = CliRunner().invoke(app, ["run", probe.name, "--period", PERIOD])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: job {probe.name} is not ready: no model endpoint named "
                           "'nowhere'")
    assert line.endswith("Nothing was written and no model was called")
    assert flow_runs_named(f"{probe.name}/{PERIOD}") == 0
    assert env.ledger.runs(job=probe.name) == []


def test_the_shipped_job_declares_the_webhook_and_bucket_its_settings_name(env: Env) -> None:
    """competitor-summary's targets follow its settings: email alone by default, plus the
    webhook endpoint and the bucket when they are set."""
    from flows.jobs.competitor_summary import job

    assert job.target_list() == [Target.email()]
    env.set(competitor_summary_webhook="summaries-api", competitor_summary_bucket="reports")
    assert job.target_list() == [Target.email(), Target.webhook("summaries-api"),
                                 Target.object("reports")]


def test_a_revision_that_would_send_to_a_missing_block_is_refused_before_it_is_requested(
        env: Env, targets: list[Target]) -> None:
    """A job whose targets gained a missing webhook block since its Run completed: a revise
    that resends ends NotReady with no revision row and no model call; one that sends nothing
    (resend=False) needs no block and is revised."""
    targets.append(Target.email())
    probe = probe_job(targets=lambda: list(targets))
    state, _ = env.run(probe.name, period=PERIOD)
    assert state.is_completed(), state.message
    [run] = env.ledger.runs(job=probe.name)
    calls = env.model_calls()
    targets.append(Target.webhook(unique("absent-api")))
    refused = final_state(revise(run_id=run.run_id, reason="new wording", return_state=True))
    assert (refused.type.value, refused.name) == ("FAILED", "NotReady")
    assert "does not exist" in (refused.message or "")
    assert len(env.ledger.revisions(run.run_id)) == 1 and env.model_calls() == calls
    quiet = final_state(revise(run_id=run.run_id, reason="new wording", resend=False,
                               return_state=True))
    assert quiet.name == "Completed" and "Revised" in (quiet.message or ""), quiet.message
    assert len(env.ledger.revisions(run.run_id)) == 2
