"""`runledger check`: is this setup able to run its jobs? One finding per line a person reads in
one screen: the ledger reachable and migrated, the registered jobs and the package each came
from, every run-job deployment's schedule against its Job (on the Prefect server, and in a
prefect.yaml of the current folder), the work pools those deployments use, the mail and model
endpoints reachable. Any ``fail`` makes the command's exit status 1."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal

import httpx

from deployments.project import DeploymentSpec, ScheduleSpec, load_deployments
from flows.deployment_check import schedule_problems
from flows.registry import ENTRY_POINT_GROUP, jobs_from_entry_points, registered_jobs, shipped_jobs
from store import Ledger, RunledgerError

Status = Literal["ok", "warn", "fail", "skip"]
CONNECT_SECONDS = 5.0


@dataclass(frozen=True)
class Finding:
    """One line of the checklist."""

    status: Status
    topic: str
    detail: str


def ledger_finding() -> Finding:
    """The ledger at RUNLEDGER_DATABASE_URL exists and its schema is at the latest migration."""
    try:
        with Ledger.open_existing() as ledger:
            url = ledger.engine.url.render_as_string(hide_password=True)
            return Finding("ok", "ledger", f"{url} ({ledger.dialect}), schema at the latest "
                                           "migration")
    except RunledgerError as exc:
        return Finding("fail", "ledger", str(exc))


def job_sources() -> dict[str, str]:
    """Each registered job's package: runledger itself or the distribution whose entry point
    publishes it."""
    sources = {job.name: "runledger (shipped)" for job in shipped_jobs()}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{entry.dist.name} {entry.dist.version}" if entry.dist else "?"
        for job in jobs_from_entry_points([entry]):
            sources[job.name] = f"{dist}, entry point {entry.name} = {entry.value}"
    return sources


def jobs_finding() -> list[Finding]:
    try:
        jobs = registered_jobs()
        sources = job_sources()
    except RunledgerError as exc:
        return [Finding("fail", "jobs", str(exc))]
    return [Finding("ok", "job", f"{job.name} v{job.version}, {job.cadence} in {job.timezone}: "
                                 f"{sources.get(job.name, '?')}") for job in jobs.values()]


def server_specs(api_url: str, wanted_pools: set[str]) -> tuple[list[DeploymentSpec], set[str]]:
    """The run-job deployments on the Prefect server as specs, and which of the work pools
    every deployment there names, and ``wanted_pools``, do not exist."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from flows.stack.prefect_server import client

    with client(api_url) as api:
        found = api.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=["run-job"])))
        pools = {d.work_pool_name for d in api.read_deployments() if d.work_pool_name}
        pools |= wanted_pools
        existing = {p.name for p in api.read_work_pools()}
    specs = [DeploymentSpec(
        name=d.name, entrypoint=d.entrypoint or "flows.entrypoints.run_job",
        parameters=dict(d.parameters or {}), tags=list(d.tags or []), description="",
        work_pool=d.work_pool_name or "", work_queue=d.work_queue_name or "",
        schedules=[ScheduleSpec(slug=s.slug or str(s.id), cron=getattr(s.schedule, "cron", None),
                                interval=_seconds(s.schedule),
                                timezone=getattr(s.schedule, "timezone", None))
                   for s in d.schedules])
        for d in found]
    return specs, pools - existing


def _seconds(schedule: object) -> float | None:
    interval = getattr(schedule, "interval", None)
    return interval.total_seconds() if interval is not None else None


def deployment_findings(api_url: str | None, now: datetime, folder: Path) -> list[Finding]:
    """Schedules of run-job deployments (server and ./prefect.yaml) against their Jobs, jobs
    without a deployment, and missing work pools."""
    findings: list[Finding] = []
    local = folder / "prefect.yaml"
    wanted_pools: set[str] = set()
    if local.is_file():
        try:
            local_specs = load_deployments(local)
            wanted_pools = {spec.work_pool for spec in local_specs}
            problems = schedule_problems(local_specs, now)
        except RunledgerError as exc:
            problems = [str(exc)]
        findings += [Finding("fail", "prefect.yaml", p) for p in problems] or [
            Finding("ok", "prefect.yaml", f"{local}: every job's schedule agrees with its Job")]
    if not api_url:
        return [*findings, Finding("skip", "deployments",
                                   "PREFECT_API_URL is not set: the server's deployments and "
                                   "work pools were not checked")]
    try:
        specs, missing_pools = server_specs(api_url, wanted_pools)
    except Exception as exc:  # any failure to reach the server is this line's finding
        return [*findings, Finding("fail", "prefect", f"{api_url}: {type(exc).__name__}: "
                                                      f"{str(exc)[:200]}")]
    deployed = {spec.job for spec in specs}
    for spec in specs:
        problems = schedule_problems([spec], now)
        findings += [Finding("fail", "deployment", p) for p in problems] or [
            Finding("ok", "deployment", f"{spec.name}: job {spec.job}, schedule agrees with "
                                        f"its Job, pool {spec.work_pool or '-'}")]
    for name in sorted(set(registered_jobs()) - deployed):
        findings.append(Finding("warn", "deployment",
                                f"job {name} has no deployment on {api_url}: nothing schedules "
                                "it (prefect deploy, or runledger serve)"))
    for pool in sorted(missing_pools):
        findings.append(Finding("fail", "work pool",
                                f"{pool} does not exist on {api_url} (named by a deployment or "
                                f"./prefect.yaml): prefect work-pool create {pool} --type "
                                "process"))
    if not missing_pools:
        findings.append(Finding("ok", "work pool", "every deployment's pool exists"))
    return findings


def mail_finding(connect: Callable[[str, int], None] | None = None) -> Finding:
    """The configured mail transport answers: SMTP accepts a connection and greets (220), or
    the HTTP provider answers at all."""
    from flows.mail.channel import EmailDeliverySettings
    from flows.mail.settings import ProviderSettings, SmtpSettings, load_settings

    where = "mail settings"
    try:
        if EmailDeliverySettings().transport == "provider":
            provider = load_settings(ProviderSettings)
            response = httpx.get(provider.url, timeout=CONNECT_SECONDS)
            return Finding("ok", "mail", f"http provider {provider.url} answered "
                                         f"{response.status_code}")
        smtp = load_settings(SmtpSettings)
        where = f"smtp {smtp.host}:{smtp.effective_port}"
        greeting = (connect or _smtp_greeting)(smtp.host, smtp.effective_port)
        return Finding("ok", "mail", f"smtp {smtp.host}:{smtp.effective_port} ({smtp.tls}) "
                                     f"{greeting}")
    except (RunledgerError, OSError, httpx.HTTPError, ValueError) as exc:
        return Finding("fail", "mail", f"{where}: {type(exc).__name__}: {exc} "
                                       "(RUNLEDGER_SMTP_HOST, RUNLEDGER_SMTP_PORT, "
                                       "RUNLEDGER_DELIVERY_TRANSPORT)")


def _smtp_greeting(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=CONNECT_SECONDS) as sock:
        sock.settimeout(CONNECT_SECONDS)
        try:
            first = sock.recv(512).decode("ascii", "replace").strip()
        except TimeoutError:  # implicit TLS: the server waits for the handshake
            return "accepted a connection"
    if not first.startswith("220"):
        raise OSError(f"it greeted {first[:80]!r}, not 220")
    return "answered 220"


def channels_findings() -> list[Finding]:
    """Every channel a job's targets name is one the delivery deployment delivers
    (RUNLEDGER_DELIVERY_CHANNELS): otherwise its messages would wait in the outbox forever."""
    from flows.delivery.settings import DeliverySettings

    delivered = DeliverySettings().channel_list
    findings: list[Finding] = []
    try:
        jobs = registered_jobs()
        for job in jobs.values():
            channels = dict.fromkeys(t.channel for t in job.target_list())
            findings += [Finding(
                "fail", "channels",
                f"job {job.name} queues {channel} messages, which RUNLEDGER_DELIVERY_CHANNELS="
                f"{','.join(delivered)} does not deliver; add {channel} to it")
                for channel in channels if channel not in delivered]
    except RunledgerError as exc:
        return [Finding("fail", "channels", str(exc))]
    return findings or [Finding("ok", "channels", f"every job's messages go by "
                                                  f"{', '.join(delivered)}, which RUNLEDGER_"
                                                  "DELIVERY_CHANNELS delivers")]


def model_finding() -> Finding:
    """The model endpoint answers its probe (GET /models) with success; 401/403 says the key
    is refused, any other answer that the URL is not the API's base."""
    from flows.settings import RunledgerSettings

    settings = RunledgerSettings()
    if settings.model == "offline":
        return Finding("ok", "model", "offline (no endpoint; RUNLEDGER_MODEL=openai for one)")
    base = (settings.model_base_url or "https://api.openai.com/v1").rstrip("/")
    key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    try:
        response = httpx.get(f"{base}/models", timeout=CONNECT_SECONDS,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        return Finding("fail", "model", f"{base}: {type(exc).__name__}: {exc} "
                                        "(RUNLEDGER_MODEL_BASE_URL)")
    if response.status_code in (401, 403):
        return Finding("fail", "model", f"{base} refused the key ({response.status_code}): "
                                        "RUNLEDGER_MODEL_API_KEY")
    if not response.is_success:
        return Finding("fail", "model", f"{base}/models answered {response.status_code}, not "
                                        "success: RUNLEDGER_MODEL_BASE_URL must be the base of an "
                                        "OpenAI-compatible API (usually ending in /v1)")
    return Finding("ok", "model", f"{base} answered {response.status_code}")


def check_all(api_url: str | None, now: datetime, folder: Path) -> list[Finding]:
    """Every finding, in reading order."""
    return [ledger_finding(), *jobs_finding(), *deployment_findings(api_url, now, folder),
            *channels_findings(), mail_finding(), model_finding()]
