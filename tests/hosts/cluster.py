"""The cluster: runledger's production shape on one machine, each host a network namespace on
one private bridge (tests/hosts/netns.py).

    db     10.213.38.2   a private PostgreSQL cluster: the ledger's and the Prefect server's databases
    api    10.213.38.3   `prefect server start` (PostgreSQL-backed), its events through a private Redis
    mail   10.213.38.4   the SMTP sink, STARTTLS (tests/hosts/mail_host.py)
    model  10.213.38.5   an OpenAI-compatible model server (tests/hosts/model_host.py)
    ctl    10.213.38.9   the test process itself, while it runs the drill (setns of its thread)
    w1..w3 10.213.38.11-13  `prefect worker` of one process work pool, each with the runledger
                         environment and its own PREFECT_API_URL to api

Deployments come from deployments/prefect.yaml (the run-job, reconcile and deliver-outbox
flows), applied by `prefect deploy` from w1 to a pool of the cluster's own, with the drill jobs
(tests/hosts/jobs.py) published under the runledger.jobs entry point on every host. Everything
is torn down on exit, whatever happened: processes, namespaces, data folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, State

from store import Ledger
from tests.hosts import netns
from tests.hosts.jobs import ENV as JOBS_ENV
from tests.hosts.mail_host import make_certificates
from tests.hosts.product import (
    ENTRY_POINT_GROUP,
    PROJECT_ROOT,
    Child,
    Supervisor,
    api_url,
    client,
    commands,
    deployment,
    ensure_pool,
    install_crash_detector,
    server_env,
    wait_until_healthy,
)
from tests.support.private_postgres import PrivateCluster, binaries
from tests.support.waiting import wait_until

HOSTS = {"db": 2, "api": 3, "mail": 4, "model": 5, "ctl": 9, "w1": 11, "w2": 12, "w3": 13}
WORKERS = ("w1", "w2", "w3")
POOL = "hosts"
PG_PORT, API_PORT, SMTP_PORT, MODEL_PORT, REDIS_PORT = 5432, 4200, 2525, 8000, 6379
SENDER = "runledger@hosts.example.org"
HEARTBEAT_SECONDS = 30  # the least Prefect accepts for flow-run heartbeats
CRASH_AFTER_SECONDS = 60
RUN_JOB, RECONCILE, DELIVER = "hosts-run-job", "hosts-reconcile", "hosts-deliver"
REQUIRED = os.environ.get("RUNLEDGER_REQUIRE_POSTGRES") == "1"


def unavailable(reason: str) -> None:
    """Refuse to run: a failure in CI (RUNLEDGER_REQUIRE_POSTGRES=1), a skip elsewhere."""
    message = f"the host drills cannot run here: {reason}"
    if REQUIRED:
        pytest.fail(message + " (RUNLEDGER_REQUIRE_POSTGRES=1: these drills must run)")
    pytest.skip(message)


def sweep_folders() -> list[Path]:
    """Data folders of earlier runs whose process is gone (killed with SIGKILL)."""
    gone = []
    for folder in Path(tempfile.gettempdir()).glob(f"{netns.PREFIX}*"):
        pid = folder.name.removeprefix(netns.PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


def published_jobs(folder: Path) -> Path:
    """A distribution's metadata publishing tests.hosts.jobs under runledger.jobs; the folder
    to put on PYTHONPATH."""
    info = folder / "runledger_hosts_jobs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: runledger-hosts-jobs\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nhosts = tests.hosts.jobs\n")
    return folder


def cluster_deployments() -> dict[str, Any]:
    """The run-job, reconcile and deliver-outbox deployments of deployments/prefect.yaml on
    the cluster's pool, without schedules (the drills start each flow run themselves)."""
    made = []
    for name, source in ((RUN_JOB, "competitor-summary"), (RECONCILE, "reconcile"),
                         (DELIVER, "deliver-outbox")):
        spec = deployment(source)
        made.append({"name": name, "entrypoint": spec["entrypoint"], "parameters": {},
                     "tags": ["runledger", "hosts"],
                     "work_pool": {"name": POOL, "work_queue_name": "default"}})
    spec = deployment("competitor-summary")
    return {"name": "runledger-hosts", "build": spec["build"], "pull": spec["pull"],
            "deployments": made}


@dataclass
class Cluster:
    root: Path
    jobs: Mapping[str, tuple[int, float]]  # job name -> (subjects, model seconds)
    mail_faults: tuple[str, ...] = ()
    lease_seconds: float = 6.0
    settings: Mapping[str, str] = field(default_factory=dict)  # more RUNLEDGER_* for workers
    network: netns.Network = field(default_factory=netns.Network)
    supervisor: Supervisor = field(init=False)
    postgres: PrivateCluster | None = None
    workers: dict[str, Child] = field(default_factory=dict)
    api_child: Child | None = None
    redis_child: Child | None = None

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.root / "logs", grace_seconds=10)

    # --- addresses and environments ----------------------------------------------------------

    def address(self, host: str) -> str:
        return f"{netns.SUBNET}.{HOSTS[host]}"

    @property
    def api(self) -> str:
        return api_url(self.address("api"), API_PORT)

    def pg_url(self, database: str, driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://postgres@{self.address('db')}:{PG_PORT}/{database}"

    @property
    def ledger_url(self) -> str:
        return self.pg_url("ledger")

    @property
    def model_log(self) -> Path:
        return self.root / "model-requests.jsonl"

    @property
    def maildir(self) -> Path:
        return self.root / "mail"

    def host_env(self, host: str) -> dict[str, str]:
        """A worker host's environment: its own Prefect home and API URL, the runledger
        settings every host shares."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RUNLEDGER_"))}
        env.update({
            "PREFECT_API_URL": self.api,
            "PREFECT_HOME": str(self.root / "hosts" / host / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_WORKER_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS),
            "PYTHONPATH": os.pathsep.join([str(self.root / "dist"), str(PROJECT_ROOT)]),
            "RUNLEDGER_DATABASE_URL": self.ledger_url,
            "RUNLEDGER_SMTP_HOST": self.address("mail"),
            "RUNLEDGER_SMTP_PORT": str(SMTP_PORT),
            "RUNLEDGER_SMTP_TLS": "starttls",
            "RUNLEDGER_SMTP_CA_FILE": str(self.root / "tls" / "ca.pem"),
            "RUNLEDGER_SMTP_TIMEOUT": "5",
            "RUNLEDGER_MAIL_FROM": SENDER,
            "RUNLEDGER_MODEL": "openai",
            "RUNLEDGER_MODEL_BASE_URL": f"http://{self.address('model')}:{MODEL_PORT}/v1",
            "RUNLEDGER_MODEL_NAME": "hosts-model",
            "RUNLEDGER_LEASE_SECONDS": str(self.lease_seconds),
            "RUNLEDGER_TASK_RETRIES": "3",
            "RUNLEDGER_RETRY_DELAY_SECONDS": "0.5",
            "RUNLEDGER_DELIVERY_BASE_DELAY_SECONDS": "0.5",
            "RUNLEDGER_DELIVERY_MAX_DELAY_SECONDS": "2",
            "RUNLEDGER_DELIVERY_LEASE_SECONDS": "30",
            "RUNLEDGER_RECONCILE_BACKOFF_SECONDS": "1",
            JOBS_ENV: json.dumps({k: list(v) for k, v in self.jobs.items()}),
            "COLUMNS": "160",
        })
        env.update(self.settings)
        return env

    # --- processes on hosts --------------------------------------------------------------------

    def in_host(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.network.ns(host), *argv]

    def start(self, host: str, name: str, argv: list[str], env: Mapping[str, str]) -> Child:
        return self.supervisor.start(f"{host}-{name}", self.in_host(host, argv), env,
                                     cwd=PROJECT_ROOT)

    def runledger(self, host: str, *args: str, env: Mapping[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The runledger CLI on ``host``, waited for."""
        return subprocess.run(self.in_host(host, commands.runledger_argv(*args)),
                              env=env or self.host_env(host), cwd=PROJECT_ROOT,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def start_worker(self, host: str, env: Mapping[str, str] | None = None) -> Child:
        """A process worker on ``host``, polling the default queue and its own."""
        child = self.start(host, "worker", commands.worker_argv(POOL, host, ["default", host]),
                           env or self.host_env(host))
        self.workers[host] = child
        return child

    def lose(self, host: str) -> list[int]:
        """Every process on ``host`` SIGKILLed at once (the host loses power)."""
        self.workers.pop(host, None)
        return netns.kill_all_in(self.network.ns(host))

    def start_api(self) -> None:
        env = server_env(os.environ, self.root / "hosts" / "api" / "prefect",
                         self.pg_url("prefect", "asyncpg"),
                         f"redis://127.0.0.1:{REDIS_PORT}/0")
        env["PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS"] = "2"
        env["PREFECT_SERVER_LOG_RETRYABLE_ERRORS"] = "true"
        self.api_child = self.start("api", "prefect-server",
                                    commands.server_argv("0.0.0.0", API_PORT, ui=False), env)
        wait_until_healthy(self.api, self.api_child, timeout=180)

    def stop_api(self) -> None:
        """The api host goes down: its Prefect server SIGKILLed (Redis and PostgreSQL stay)."""
        assert self.api_child is not None
        self.supervisor.kill(self.api_child)
        self.api_child = None

    # --- bring-up and teardown -----------------------------------------------------------------

    def up(self) -> Cluster:
        """Start every host's processes (the network exists, this thread is in ctl)."""
        for host in HOSTS:
            (self.root / "hosts" / host).mkdir(parents=True)
        published_jobs(self.root / "dist")
        make_certificates(self.root / "tls", self.address("mail"))
        pg_bin = binaries()
        if pg_bin is None:
            unavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
        assert pg_bin is not None
        self.postgres = PrivateCluster(
            pg_bin, port=PG_PORT, home=self.root / "pg", listen="0.0.0.0",
            hba=(f"host all all {netns.SUBNET}.0/24 trust",),
            wrap=("ip", "netns", "exec", self.network.ns("db")))
        self.postgres.home.mkdir()
        self.postgres.start()
        admin = sa.create_engine(self.pg_url("postgres"), isolation_level="AUTOCOMMIT",
                                 poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            for name in ("ledger", "prefect"):
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        admin.dispose()
        self.redis_child = self.start("api", "redis", [
            "redis-server", "--bind", "127.0.0.1", "--port", str(REDIS_PORT), "--save", "",
            "--appendonly", "no", "--dir", str(self.root / "hosts" / "api")], dict(os.environ))
        wait_until(lambda: netns.in_ns(self.network.ns("api"), "redis-cli", "-p", str(REDIS_PORT),
                                       "ping", check=False).stdout.strip() == "PONG",
                   30, "Redis on api")
        self.start("mail", "sink", [sys.executable, "-m", "tests.hosts.mail_host",
                                    self.address("mail"), str(SMTP_PORT), str(self.maildir),
                                    str(self.root / "tls"), *self.mail_faults], dict(os.environ))
        self.start("model", "model", [sys.executable, "-m", "tests.hosts.model_host",
                                      "0.0.0.0", str(MODEL_PORT), str(self.model_log)],
                   {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
        self.start_api()
        upgraded = self.runledger("w1", "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        with client(self.api) as api:
            ensure_pool(api, POOL, WORKERS)
            # runledger's zombie detection: a flow run silent for CRASH_AFTER_SECONDS is Crashed.
            install_crash_detector(api, CRASH_AFTER_SECONDS)
        prefect_file = self.root / "prefect.yaml"
        prefect_file.write_text(yaml.safe_dump(cluster_deployments(), sort_keys=False))
        deployed = subprocess.run(
            self.in_host("w1", commands.prefect_argv("--no-prompt", "deploy", "--all",
                                                     "--prefect-file", str(prefect_file))),
            cwd=PROJECT_ROOT, env=self.host_env("w1"), capture_output=True, text=True,
            timeout=300, check=False)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        for host in WORKERS:
            self.start_worker(host)
        self.wait_online(*WORKERS)
        return self

    def down(self) -> None:
        try:
            self.supervisor.stop()
        finally:
            try:
                if self.postgres is not None:
                    self.postgres.destroy()
            finally:
                self.network.destroy()

    # --- the Prefect API, from ctl --------------------------------------------------------------

    def online(self) -> set[str]:
        with client(self.api) as api:
            return {w.name for w in api.read_workers_for_work_pool(POOL) if w.status == "ONLINE"}

    def wait_online(self, *hosts: str) -> None:
        wait_until(lambda: set(hosts) <= self.online(), 120, f"workers {hosts} online")

    def run(self, name: str, parameters: dict[str, Any] | None = None, on: str | None = None,
            env: dict[str, str] | None = None, state: State[Any] | None = None) -> UUID:
        """A new flow run of the cluster's deployment ``name`` ("Custom run" in the UI), on the
        work queue of worker ``on`` if given, with extra environment variables ``env``."""
        with client(self.api) as api:
            found = api.read_deployment_by_name(f"{self._flow_of(name)}/{name}")
            return api.create_flow_run_from_deployment(
                found.id, parameters=parameters or {}, work_queue_name=on, state=state,
                job_variables={"env": env} if env else None).id

    @staticmethod
    def _flow_of(name: str) -> str:
        return {RUN_JOB: "run-job", RECONCILE: "reconcile", DELIVER: "deliver-outbox"}[name]

    def flow_runs(self, ids: list[UUID]) -> list[FlowRun]:
        with client(self.api) as api:
            return api.read_flow_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=ids)), limit=len(ids) + 1)

    def all_flow_runs(self) -> list[FlowRun]:
        with client(self.api) as api:
            return api.read_flow_runs(limit=200)

    def wait_final(self, ids: list[UUID], timeout: float) -> list[FlowRun]:
        def final() -> list[FlowRun] | None:
            runs = self.flow_runs(ids)
            done = len(runs) == len(ids) and all(r.state and r.state.is_final() for r in runs)
            return runs if done else None

        return wait_until(final, timeout, f"flow runs {ids} to finish", every=1.0)

    def state_names(self, flow_run_id: UUID) -> list[str]:
        with client(self.api) as api:
            states = api.read_flow_run_states(flow_run_id)
        return [s.name or s.type.value for s in sorted(states, key=lambda s: s.timestamp)]

    def ledger(self) -> Ledger:
        return Ledger.connect(self.ledger_url)


@contextmanager
def cluster(jobs: Mapping[str, tuple[int, float]], mail_faults: tuple[str, ...] = (),
            settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A running cluster, the calling thread inside its ctl host; everything gone on exit."""
    reason = netns.why_unavailable()
    if reason:
        unavailable(reason)
    netns.sweep()
    sweep_folders()
    root = Path(tempfile.mkdtemp(prefix=f"{netns.PREFIX}{os.getpid()}-"))
    root.chmod(0o755)  # the PostgreSQL server runs as its own user below it
    made = Cluster(root, jobs, mail_faults, settings=settings or {})
    try:
        made.network.create()
        for host, octet in HOSTS.items():
            made.network.add_host(host, octet)
        with netns.entered(made.network.ns("ctl")):
            made.up()
            yield made
    finally:
        try:
            made.down()
        finally:
            keep = os.environ.get("RUNLEDGER_HOSTS_KEEP_LOGS")
            if keep:  # the processes' logs, for a failed drill's post-mortem
                shutil.copytree(root / "logs", Path(keep) / root.name, dirs_exist_ok=True)
            shutil.rmtree(root, ignore_errors=True)
