"""Automations the stack installs on its Prefect server.

The crash detector: a flow run whose process dies with its host (SIGKILL, OOM, power) stays `Running` forever on a
self-hosted Prefect server: nothing reports the crash. Flow runs send heartbeat events
(PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds apart); this automation marks a runledger flow run
`Crashed` when no event about it arrived for ``within`` seconds after a heartbeat. The ledger does
not need it (an expired lease makes the Run claimable again); people reading the UI do."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, time, timedelta
from itertools import pairwise
from uuid import UUID
from zoneinfo import ZoneInfo

from croniter import croniter
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import BlockDocument, StateType
from prefect.events.actions import ChangeFlowRunState, SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import ObjectNotFound

from flows.events import JOB_EVENTS, OCCURRENCE_EVENTS
from flows.jobs import Job
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


def install(client: SyncPrefectClient, automation: AutomationCore) -> bool:
    """Create the automation, or update it in place when one with its name exists; True when
    it was created."""
    existing = client.read_automations_by_name(automation.name)
    if existing:
        client.update_automation(existing[0].id, automation)
        return False
    client.create_automation(automation)
    return True


def install_crash_detector(client: SyncPrefectClient, within: float) -> None:
    """Create the automation, or update it in place when one with its name exists."""
    install(client, crash_detector(within))


# --- alerts a person receives ----------------------------------------------------------------

ALERTS = "runledger: notify overdue and given-up occurrences"
DEAD_MANS_SWITCH = "runledger: {job} stopped ticking"
MIN_PROACTIVE_WITHIN = timedelta(seconds=10)  # Prefect refuses a shorter proactive window
# How far ahead a cadence is read for its longest period: a year has every month and DST change.
CADENCE_LOOKAHEAD = timedelta(days=366)
NAMED_CADENCES = ("hourly", "daily", "weekly", "monthly")
ALERTED = (OCCURRENCE_EVENTS["overdue"], OCCURRENCE_EVENTS["gave-up"])
TICK_COMPLETED = JOB_EVENTS["tick.completed"]

# The events' resource names the occurrence (job/subject/period); their payloads say why.
ALERT_SUBJECT = ('runledger {{ event.event | replace("runledger.run.", "") }}: '
                 '{{ event.resource["prefect.resource.name"] }}')
ALERT_BODY = """\
{{ event.event }}: {{ event.resource["prefect.resource.name"] }}
job {{ event.resource["runledger.job"] }}, subject {{ event.resource["runledger.subject"] }}, \
period {{ event.resource["runledger.period"] }} (version {{ event.resource["runledger.version"] }})
{% if event.payload.state %}state: {{ event.payload.state }}
{% endif %}why: {{ event.payload.reason }}
{% if event.payload.due_at %}due at: {{ event.payload.due_at }}
{% endif %}{% if event.payload.error %}error: {{ event.payload.error }}
{% endif %}run id: {{ event.resource["prefect.resource.id"] | replace("runledger.run.", "") }}
at: {{ event.occurred }}"""


def alert_automation(notify_block_id: UUID) -> AutomationCore:
    """Notify through the block once per overdue or given-up occurrence, naming its job,
    subject and period and why."""
    return AutomationCore(
        name=ALERTS,
        description="An owed occurrence is late (not completed or skipped by its due time plus "
                    "the job's grace) or reconcile gave up on its stranded Run: a person acts.",
        trigger=EventTrigger(
            match=ResourceSpecification({"prefect.resource.id": "runledger.run.*"}),
            expect=set(ALERTED),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(block_document_id=notify_block_id, subject=ALERT_SUBJECT,
                                  body=ALERT_BODY)],
    )


def cadence_length(job: Job, now: datetime) -> timedelta:
    """The longest of the job's periods from the one of ``now`` over the next year (a
    weekday cron's weekend, a 25-hour day at the end of DST, a 31-day month): the longest a
    healthy job goes between two ticks."""
    if job.cadence in NAMED_CADENCES:
        period = job.period_at(now)
        longest = period.end - period.start
        while period.end < now + CADENCE_LOOKAHEAD:
            period = job.period_at(period.end)
            longest = max(longest, period.end - period.start)
        return longest
    return _cron_longest_gap(job.cadence, ZoneInfo(job.timezone), now)


def _cron_longest_gap(cadence: str, tz: ZoneInfo, now: datetime) -> timedelta:
    """The longest gap between two fires of a cron schedule over the lookahead, day by day
    (cron fires at the same times on every day it fires): the longest gap inside a firing day,
    or from one firing day's last fire to the next one's first, measured in UTC. Walking the
    job's periods instead costs a DST-aware scan each, minutes for a per-minute cron."""
    def utc(wall: datetime) -> datetime:
        return wall.replace(tzinfo=tz).astimezone(UTC)

    def first_fire_after(wall: datetime) -> datetime:
        fire: datetime = croniter(cadence, wall).get_next(datetime)
        return fire

    start = now.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    day = first_fire_after(start).date()
    midnight = datetime.combine(day, time(0))
    fires, fire = [], first_fire_after(midnight - timedelta(minutes=1))
    while fire.date() == day:
        fires.append(fire)
        fire = first_fire_after(fire)
    longest = max((utc(b) - utc(a) for a, b in pairwise(fires)),
                  default=timedelta(0))
    first, last = fires[0].time(), fires[-1].time()
    end = start + CADENCE_LOOKAHEAD
    while datetime.combine(day, first) < end:
        following = first_fire_after(datetime.combine(day, last))
        longest = max(longest, utc(following) - utc(datetime.combine(day, last)))
        day = following.date()
    return longest


def switch_within(job: Job, now: datetime) -> timedelta:
    """How long the dead man's switch waits for a tick: one cadence plus the job's grace."""
    return max(cadence_length(job, now) + job.grace, MIN_PROACTIVE_WITHIN)


def dead_mans_switch(job: Job, notify_block_id: UUID, now: datetime,
                     within: timedelta | None = None) -> AutomationCore:
    """Notify through the block when no ``runledger.tick.completed`` of ``job`` arrived for
    ``within`` (default: ``switch_within``, at least 10 s): its ticks stopped completing,
    whatever stopped them.

    Prefect counts the ticks in consecutive windows of ``within`` from when it loads the
    automation; a window without one notifies, and so does each further silent window."""
    window = switch_within(job, now) if within is None else within
    if window < MIN_PROACTIVE_WITHIN:
        raise StackError(f"a proactive automation waits at least "
                         f"{MIN_PROACTIVE_WITHIN.total_seconds():.0f} s, got "
                         f"{window.total_seconds():g} s")
    waited = _duration(window)
    return AutomationCore(
        name=DEAD_MANS_SWITCH.format(job=job.name),
        description=f"No tick of job {job.name} ({job.cadence}, {job.timezone}) completed every "
                    f"subject for {waited} (one cadence plus grace).",
        trigger=EventTrigger(
            match=ResourceSpecification({"prefect.resource.id": f"runledger.job.{job.name}"}),
            expect={TICK_COMPLETED},
            posture=Posture.Proactive,
            threshold=1,
            within=window,
        ),
        actions=[SendNotification(
            block_document_id=notify_block_id,
            subject=f"runledger: job {job.name} stopped ticking",
            body=(f"No tick of job {job.name} completed every subject in the last {waited} "
                  f"(cadence {job.cadence} in {job.timezone}, grace {_duration(job.grace)}).\n"
                  f"The scheduler, the workers or the job itself may be down; "
                  f"`runledger overdue --job {job.name}` lists what it owes.\n"
                  "at: {{ firing.triggered }}"),
        )],
    )


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"),
                                            (seconds, "s")) if n]
    return " ".join(parts) or "0 s"


BUDGET_EXHAUSTED = JOB_EVENTS["budget.exhausted"]
BUDGET_ALERT = "runledger: notify an exhausted budget"
BUDGET_SUBJECT = ('runledger budget exhausted: {{ event.resource["runledger.job"] }} '
                  '({{ event.payload.scope }} from {{ event.payload.window_start }})')
BUDGET_BODY = """\
{{ event.event }}: job {{ event.resource["runledger.job"] }}
window: {{ event.payload.scope }} from {{ event.payload.window_start }}
{{ event.payload.spent }}; calls refused: {{ event.payload.refused }}
what to do: {{ event.payload.fix }}
at: {{ event.occurred }}"""


def budget_automation(notify_block_id: UUID) -> AutomationCore:
    """Notify through the block once per exhausted budget window, saying how much was spent
    and how to raise the cap."""
    return AutomationCore(
        name=BUDGET_ALERT,
        description="A job's budget window has no room for its next model call: its subjects "
                    "end over-budget until the window resets or the cap is raised.",
        trigger=EventTrigger(
            match=ResourceSpecification({"prefect.resource.id": "runledger.job.*"}),
            expect={BUDGET_EXHAUSTED},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(block_document_id=notify_block_id, subject=BUDGET_SUBJECT,
                                  body=BUDGET_BODY)],
    )


def install_alerts(client: SyncPrefectClient, jobs: Iterable[Job], notify_block_id: UUID,
                   now: datetime) -> list[str]:
    """Install (create or update by name) the overdue/give-up alert, the budget alert and
    every job's dead man's switch; their names."""
    automations = [alert_automation(notify_block_id), budget_automation(notify_block_id),
                   *(dead_mans_switch(job, notify_block_id, now) for job in jobs)]
    for automation in automations:
        install(client, automation)
    return [a.name for a in automations]


def notification_block(client: SyncPrefectClient, name: str) -> BlockDocument:
    """The notification block named ``name``: ``block-type-slug/name`` (``custom-webhook/ops``)
    as Prefect names blocks, or the bare name when exactly one notification block has it."""
    if "/" in name:
        slug, document = name.split("/", 1)
        try:
            found = [client.read_block_document_by_name(document, slug, include_secrets=False)]
        except ObjectNotFound:
            found = []
    else:
        found = [b for b in client.read_block_documents(include_secrets=False)
                 if b.name == name and not b.is_anonymous]
    if not found:
        raise StackError(f"no block {name!r} on the Prefect server; create a notification "
                         f"block (e.g. a Custom Webhook) and name it as `prefect block ls` "
                         f"shows it, like custom-webhook/ops")
    notifying = [b for b in found if b.block_schema is not None
                 and "notify" in b.block_schema.capabilities]
    if not notifying:
        raise StackError(f"block {name!r} is not a notification block (it cannot notify)")
    if len(notifying) > 1:
        names = ", ".join(sorted(_block_name(b) for b in notifying))
        raise StackError(f"several notification blocks are named {name!r} ({names}); "
                         f"name one with its type")
    return notifying[0]


def _block_name(block: BlockDocument) -> str:
    slug = block.block_type.slug if block.block_type is not None else "?"
    return f"{slug}/{block.name}"
