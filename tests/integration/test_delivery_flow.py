"""The deliver-outbox Prefect flow on a temporary Prefect server: it runs the dispatcher,
publishes a summary artifact and one event per outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flows.delivery.flow import ARTIFACT_KEY, deliver_outbox
from flows.mail.sink import Fault, Sink
from store import Ledger
from tests.support.delivery import SENDER, queue
from tests.support.pipeline import final_state
from tests.support.waiting import wait_until


async def artifacts_and_events(flow_run_id: str) -> tuple[list[Any], list[Any]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[ARTIFACT_KEY])))
        page = await client.read_events(
            filter=EventFilter(event=EventNameFilter(prefix=["runledger.outbox."])), limit=50)
    mine = [e for e in page.events
            if any(r.id == f"prefect.flow-run.{flow_run_id}" for r in e.related)]
    return [a for a in artifacts if str(a.flow_run_id) == flow_run_id], mine


def test_the_flow_parameters_are_described() -> None:
    """batch_size, max_seconds and smtp_block carry descriptions for the Prefect UI."""
    schema = deliver_outbox.parameters.model_dump()["properties"]
    assert set(schema) == {"batch_size", "max_seconds", "smtp_block"}
    assert all(schema[name].get("description") for name in schema)
    assert deliver_outbox.name == "deliver-outbox"


@pytest.mark.timeout(300)
def test_the_flow_delivers_and_reports_with_an_artifact_and_events(
    prefect_api: str, db_url: str, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One flow run: one message sent, one refused with 550 (dead); the artifact counts both and
    runledger.outbox.sent / .dead name the message as resource and its Run as related."""
    queued = queue(ledger, 2)
    run_id = queued[0].run_id
    with Sink(faults=[Fault("data", "550")]) as sink:
        for name, value in {"RUNLEDGER_DATABASE_URL": db_url, "RUNLEDGER_SMTP_HOST": sink.host,
                            "RUNLEDGER_SMTP_PORT": str(sink.port), "RUNLEDGER_SMTP_TLS": "none",
                            "RUNLEDGER_MAIL_FROM": SENDER}.items():
            monkeypatch.setenv(name, value)
        state = final_state(deliver_outbox(batch_size=10, max_seconds=30, return_state=True))
    assert state.is_completed(), state.message
    counts = state.result()
    assert (counts["sent"], counts["dead"]) == (1, 1)
    flow_run_id = str(state.state_details.flow_run_id)

    def reported() -> tuple[list[Any], list[Any]] | None:
        artifacts, events = asyncio.run(artifacts_and_events(flow_run_id))
        return (artifacts, events) if artifacts and len(events) >= 2 else None

    artifacts, events = wait_until(reported, 60, "the pass's artifact and its two events")
    [artifact] = artifacts
    assert "| sent | 1 |" in artifact.data and "| dead | 1 |" in artifact.data
    assert sorted(e.event for e in events) == ["runledger.outbox.dead", "runledger.outbox.sent"]
    keys = {m.message_id for m in queued}
    for event in events:
        assert event.resource.id.removeprefix("runledger.outbox.message.") in keys
        assert f"runledger.run.{run_id}" in {r.id for r in event.related}
    [dead] = [e for e in events if e.event == "runledger.outbox.dead"]
    assert dead.payload["reply_code"] == 550
