"""The acceptance stack: a real `prefect server` on a fresh PostgreSQL database, the process work
pool with deployments/prefect.yaml applied by `prefect deploy`, two `prefect worker` processes,
the SMTP sink writing .eml files, a counting offline model and a PostgreSQL ledger. Every process
is started by one Supervisor, which stops all of them (and their flow-run processes) at the end."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import httpx
import sqlalchemy as sa
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas import OrchestrationResult
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.states import Cancelling, Scheduled

from deployments.project import PROJECT_ROOT
from flows.ports import free_port
from flows.stack import commands
from flows.stack.automations import HEARTBEAT_SECONDS, install_crash_detector
from flows.stack.kickoff import deployment_ids
from flows.stack.prefect_server import api_url, client, server_env, wait_until_healthy
from flows.stack.processes import Child, Supervisor
from flows.stack.work_pool import DEFAULT_POOL, ensure_pool
from store import Ledger
from tests.support.ledger import model_calls
from tests.support.waiting import wait_until

T = TypeVar("T")
POOL = DEFAULT_POOL
WORKER_QUEUES = {"worker-a": ["default", "worker-a"], "worker-b": ["default", "worker-b"]}
LEASE_SECONDS = 10
MODEL_DELAY_SECONDS = 3
# Longer than the 30 s heartbeat interval (else live runs would be marked crashed), short enough
# that the crash drill does not wait long.
CRASH_AFTER_SECONDS = 40
SENDER = "runledger@example.org"


@dataclass
class AcceptanceStack:
    """Handles on the running stack, and the operations a person would do in the UI."""

    supervisor: Supervisor
    api: str
    ledger_url: str
    mail_dir: Path
    worker_env: dict[str, str]
    workers: dict[str, Child] = field(default_factory=dict)

    # --- processes ---------------------------------------------------------------------------

    def start_worker(self, name: str, queue_of: str | None = None) -> Child:
        """A `prefect worker` polling the default queue and its own (``queue_of``'s queues)."""
        queues = WORKER_QUEUES[queue_of or name]
        child = self.supervisor.start(name, commands.worker_argv(POOL, name, queues),
                                      self.worker_env)
        self.workers[name] = child
        return child

    def wait_online(self, *names: str) -> None:
        def online() -> bool:
            with self.client() as api:
                up = {w.name for w in api.read_workers_for_work_pool(POOL) if w.status == "ONLINE"}
            return set(names) <= up

        wait_until(online, 120, f"workers {', '.join(names)} to come online")

    def submitted_by(self, flow_run_id: UUID) -> set[str]:
        """The workers whose log says they submitted the flow run."""
        line = re.compile(rf"Worker '([\w-]+)' submitting flow run '{flow_run_id}'")
        return {m.group(1) for child in self.supervisor.children
                for m in line.finditer(child.log_tail(lines=100_000))}

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL the worker and every flow-run process it started, at once (the host dies)."""
        return self.supervisor.kill(self.workers.pop(name))

    # --- the Prefect API, as the UI uses it ----------------------------------------------------

    def client(self) -> SyncPrefectClient:
        return client(self.api)

    def deployment_id(self, name: str) -> UUID:
        with self.client() as api:
            return deployment_ids(api, [name])[name]

    def pause_schedules(self, deployment: str) -> None:
        """Deactivate a deployment's schedules and delete the flow runs they already made
        (the server deletes only those still in the future)."""
        deployment_id = self.deployment_id(deployment)
        with self.client() as api:
            for schedule in api.read_deployment(deployment_id).schedules:
                api.update_deployment_schedule(deployment_id, schedule.id, active=False)
            made = api.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
            for run in made:
                if run.auto_scheduled:
                    api.delete_flow_run(run.id)

    def run(self, deployment: str, parameters: dict[str, Any] | None = None,
            queue: str | None = None, state: State[Any] | None = None,
            env: dict[str, str] | None = None) -> UUID:
        """A new flow run of ``deployment``: "Run" in the UI, or "Custom run" with parameters
        and, in its job variables, environment variables of its own."""
        with self.client() as api:
            run = api.create_flow_run_from_deployment(
                self.deployment_id(deployment), parameters=parameters or {},
                work_queue_name=queue, state=state,
                job_variables={"env": env} if env else None)
        return run.id

    def run_at(self, deployment: str, when: datetime, parameters: dict[str, Any],
               queue: str) -> UUID:
        return self.run(deployment, parameters, queue, Scheduled(scheduled_time=when))

    def retry(self, flow_run_id: UUID) -> None:
        """The UI's Retry button: the finished flow run goes back to Scheduled/AwaitingRetry."""
        response = httpx.post(f"{self.api}/flow_runs/{flow_run_id}/set_state", json={
            "state": {"type": "SCHEDULED", "name": "AwaitingRetry",
                      "message": "Retry from the UI"},
            "force": True,
        }, timeout=30)
        response.raise_for_status()
        assert response.json()["status"] == "ACCEPT", response.json()

    def cancel(self, flow_run_id: UUID) -> None:
        """The UI's Cancel button: the flow run goes to Cancelling, and its worker stops it."""
        with self.client() as api:
            result: OrchestrationResult[Any] = api.set_flow_run_state(flow_run_id, Cancelling())
        assert result.status.value == "ACCEPT", result

    def flow_run(self, flow_run_id: UUID) -> FlowRun:
        with self.client() as api:
            return api.read_flow_run(flow_run_id)

    def wait_final(self, flow_run_id: UUID, timeout: float = 120,
                   run_count: int = 1) -> FlowRun:
        """Wait until the flow run is final after its ``run_count``-th execution."""
        def final() -> FlowRun | None:
            run = self.flow_run(flow_run_id)
            done = run.state is not None and run.state.is_final() and run.run_count >= run_count
            return run if done else None

        return wait_until(final, timeout, f"flow run {flow_run_id} to finish")

    def state_names(self, flow_run_id: UUID) -> list[str]:
        with self.client() as api:
            states = api.read_flow_run_states(flow_run_id)
        return [s.name or s.type.value for s in sorted(states, key=lambda s: s.timestamp)]

    def deliver(self) -> FlowRun:
        """One delivery pass (the deliver-outbox deployment's "Run"), waited for."""
        return self.wait_final(self.run("deliver-outbox"))

    # --- what the tests count ------------------------------------------------------------------

    def model_calls(self, run_ids: set[str] | None = None) -> list[dict[str, Any]]:
        """The model calls the ledger recorded (each one that left a worker), oldest first."""
        with self.ledger() as ledger:
            found = model_calls(ledger)
        return [c for c in found if run_ids is None or c["run_id"] in run_ids]

    def mail(self) -> list[Message]:
        return [message_from_bytes(p.read_bytes()) for p in sorted(self.mail_dir.glob("*.eml"))]

    def ledger(self) -> Ledger:
        return Ledger.connect(self.ledger_url)


def _create_database(admin: sa.Engine, name: str) -> None:
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')


def _worker_env(base: Mapping[str, str], api: str, home: Path, ledger_url: str,
                smtp_port: int) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("PREFECT_", "RUNLEDGER_"))}
    env.update({
        "PREFECT_API_URL": api,
        "PREFECT_HOME": str(home),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RUNLEDGER_DATABASE_URL": ledger_url,
        "RUNLEDGER_SMTP_HOST": "127.0.0.1",
        "RUNLEDGER_SMTP_PORT": str(smtp_port),
        "RUNLEDGER_SMTP_TLS": "none",
        "RUNLEDGER_MAIL_FROM": SENDER,
        "RUNLEDGER_MODEL": "offline",
        "RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS": str(MODEL_DELAY_SECONDS),
        "RUNLEDGER_LEASE_SECONDS": str(LEASE_SECONDS),
        "RUNLEDGER_TASK_RETRIES": "1",
        "RUNLEDGER_RETRY_DELAY_SECONDS": "0.5",
    })
    return env


@contextmanager
def acceptance_stack(root: Path, admin: sa.Engine, ledger_url: str,
                     prefect_db_url: Callable[[str], str],
                     redis_url: str | None) -> Iterator[AcceptanceStack]:
    """Start the whole stack under ``root`` (the server's events through ``redis_url``, or
    in memory when None); everything it started is stopped on exit, also when starting fails
    half-way."""
    prefect_db = f"rlaccept_{os.getpid()}_{int(time.time())}_prefect"
    _create_database(admin, prefect_db)
    supervisor = Supervisor(root / "logs", grace_seconds=10)
    try:
        port = free_port()
        api = api_url("127.0.0.1", port)
        env = server_env(os.environ, root / "prefect-server",
                         prefect_db_url(prefect_db), redis_url)
        # The scheduler looks for due schedules every 2 s instead of every 60 s.
        env["PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS"] = "2"
        server = supervisor.start("prefect-server",
                                  commands.server_argv("127.0.0.1", port, ui=False), env)
        wait_until_healthy(api, server, timeout=180)

        smtp_port = free_port()
        mail_dir = root / "mail"
        supervisor.start("sink", commands.sink_argv("127.0.0.1", smtp_port, mail_dir),
                         dict(os.environ))
        worker_env = _worker_env(os.environ, api, root / "prefect-client", ledger_url,
                                 smtp_port)
        with client(api) as api_client:
            ensure_pool(api_client, POOL, ["worker-a", "worker-b"])
            install_crash_detector(api_client, CRASH_AFTER_SECONDS)
        deployed = subprocess.run(commands.deploy_argv(), cwd=PROJECT_ROOT, env=worker_env,
                                  capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

        stack = AcceptanceStack(supervisor, api, ledger_url, mail_dir, worker_env)
        # The tests run their delivery passes themselves (each pass is a flow-run process
        # start on two shared cores), and reconcile only where it is under test: a scheduled
        # pass runs today's period (policy "latest"), racing the test's own scheduled tick.
        stack.pause_schedules("deliver-outbox")
        stack.pause_schedules("reconcile")
        # Batch tests poll themselves, with the model their flow runs are given: a scheduled
        # poll under the workers' offline model would hold their batches' leases, failing.
        stack.pause_schedules("settle-batches")
        for name in WORKER_QUEUES:
            stack.start_worker(name)
        stack.wait_online(*WORKER_QUEUES)
        yield stack
    finally:
        supervisor.stop()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{prefect_db}" WITH (FORCE)')
    assert supervisor.tagged() == [], "processes of the acceptance stack outlived it"


def in_seconds(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def wait_for_banner(process: subprocess.Popen[str], timeout: float = 300) -> str:
    """What `runledger stack up` printed until its "Ctrl-C stops everything" banner line."""
    assert process.stdout is not None
    output: list[str] = []
    deadline = time.monotonic() + timeout
    while not any("Ctrl-C stops everything" in line for line in output):
        line = process.stdout.readline()
        assert line or process.poll() is None, "".join(output)
        output.append(line)
        assert time.monotonic() < deadline, "".join(output)
    return "".join(output)
