"""Automations the stack installs on its Prefect server.

A flow run whose process dies with its host (SIGKILL, OOM, power) stays `Running` forever on a
self-hosted Prefect server: nothing reports the crash. Flow runs send heartbeat events
(PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds apart); this automation marks a runledger flow run
`Crashed` when no event about it arrived for ``within`` seconds after a heartbeat. The ledger does
not need it (an expired lease makes the Run claimable again); people reading the UI do."""

from __future__ import annotations

from datetime import timedelta

from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from flows.stack.processes import StackError

CRASH_DETECTOR = "runledger: mark silent flow runs crashed"
HEARTBEAT_SECONDS = 30
RUNLEDGER_TAG = "runledger"


def crash_detector(within: float) -> AutomationCore:
    """The zombie-run automation; ``within`` must exceed the workers' heartbeat interval."""
    if within <= HEARTBEAT_SECONDS:
        raise StackError(f"within must be longer than the {HEARTBEAT_SECONDS} s heartbeat "
                         f"interval, got {within} s")
    return AutomationCore(
        name=CRASH_DETECTOR,
        description="A runledger flow run sent no event for a while after a heartbeat: its "
                    "process is gone. The ledger's lease expiry lets another attempt finish.",
        trigger=EventTrigger(
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification({
                "prefect.resource.role": "tag",
                "prefect.resource.id": f"prefect.tag.{RUNLEDGER_TAG}",
            }),
            # The server emits Running itself, so a process killed before its first heartbeat
            # event left it still opens a window.
            after={"prefect.flow-run.heartbeat", "prefect.flow-run.Running"},
            # Every state event counts as a sign of life, including runledger's own state
            # names (Duplicate, InProgressElsewhere, LeaseLost) that Prefect's documented
            # list of Completed/Failed/Cancelled/Crashed would miss.
            expect={"prefect.flow-run.*"},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"No heartbeat for {within:.0f} s: the flow run's process is gone.",
        )],
    )


def install_crash_detector(client: SyncPrefectClient, within: float) -> None:
    """Create the automation, or update it in place when one with its name exists."""
    automation = crash_detector(within)
    existing = client.read_automations_by_name(CRASH_DETECTOR)
    if existing:
        client.update_automation(existing[0].id, automation)
    else:
        client.create_automation(automation)
