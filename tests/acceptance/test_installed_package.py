"""runledger installed as a library: its wheel, a team's own repository scaffolded by `runledger
init` in an empty folder, a fresh virtual environment, `prefect deploy` from that folder to a
real Prefect server, a process worker; the deployment run twice (Completed, then Cached with
"Duplicate:"), and both runs listed by the API calls the UI's deployment page makes with its
default filter ("All except scheduled")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from deployments.project import PROJECT_ROOT
from flows.ports import free_port
from flows.stack import commands
from flows.stack.prefect_server import api_url, server_env, wait_until_healthy
from flows.stack.processes import Supervisor
from tests.support.waiting import wait_until

JOB = "team-digest"
PERIOD = (date.today() - timedelta(days=3)).isoformat()
# The state names Prefect's V1 UI sends for its default "All except scheduled" filter of a
# deployment's runs and of the Runs page (prefect/server/ui: every name it knows but Scheduled);
# the V2 UI sends the state types but SCHEDULED instead.
V1_LISTED_NAMES = ["Late", "Resuming", "AwaitingRetry", "AwaitingConcurrencySlot", "Pending",
                   "Paused", "Suspended", "Running", "Retrying", "Completed", "Cached",
                   "Cancelled", "Cancelling", "Crashed", "Failed", "TimedOut"]
V2_LISTED_TYPES = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "CRASHED", "PAUSED",
                   "CANCELLING"]


def run(argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=dict(env), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a person's shell: no variable of this checkout's venv or its tests."""
    return {k: v for k, v in base.items() if not k.startswith(
        ("PREFECT_", "RUNLEDGER_", "VIRTUAL_ENV", "UV_PROJECT", "PYTHON", "PYTEST"))}


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The wheel built, a team folder scaffolded and synced into its own .venv, a Prefect
    server (SQLite) and a process worker started from the team's environment."""
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the wheel and the team's environment"
    root = tmp_path_factory.mktemp("team")
    dist = root / "dist"
    run([uv, "build", "--wheel", "--out-dir", str(dist)], PROJECT_ROOT, os.environ)
    [wheel] = dist.glob("runledger-*.whl")
    folder = root / "acme-jobs"
    folder.mkdir()
    shell = clean_env(os.environ)
    init = run(commands.runledger_argv("init", "--job", JOB, "--runledger", str(wheel)),
               folder, shell)
    run([uv, "sync", "--python", sys.executable], folder, shell)
    bin_dir = folder / ".venv" / "bin"
    supervisor = Supervisor(root / "logs", grace_seconds=10)
    try:
        port = free_port()
        api = api_url("127.0.0.1", port)
        server = supervisor.start(
            "prefect-server", commands.server_argv("127.0.0.1", port, ui=False),
            server_env(os.environ, root / "prefect-server", None))
        wait_until_healthy(api, server, timeout=180)
        smtp_port = free_port()
        supervisor.start("sink", [str(bin_dir / "runledger"), "sink", "--port", str(smtp_port),
                                  "--maildir", str(root / "mail")], shell)
        env = {**shell, "PREFECT_API_URL": api, "PREFECT_HOME": str(root / "prefect-client"),
               "PREFECT_WORKER_QUERY_SECONDS": "1",
               "RUNLEDGER_DATABASE_URL": f"sqlite:///{root / 'ledger.db'}",
               "RUNLEDGER_MODEL": "offline", "RUNLEDGER_SMTP_HOST": "127.0.0.1",
               "RUNLEDGER_SMTP_PORT": str(smtp_port), "RUNLEDGER_SMTP_TLS": "none",
               "RUNLEDGER_MAIL_FROM": "jobs@acme.example", "COLUMNS": "300"}
        run([str(bin_dir / "runledger"), "db", "upgrade"], folder, env)
        run([str(bin_dir / "prefect"), "work-pool", "create", "runledger", "--type", "process"],
            folder, env)
        deployed = run([str(bin_dir / "prefect"), "--no-prompt", "deploy", "--all",
                        "--prefect-file", "prefect.yaml"], folder, env)
        supervisor.start("worker", [str(bin_dir / "prefect"), "worker", "start", "--pool",
                                    "runledger", "--type", "process"], env, cwd=folder)
        yield {"folder": folder, "api": api, "env": env, "init": init.stdout,
               "deploy": deployed.stdout, "bin": bin_dir, "supervisor": supervisor}
    finally:
        supervisor.stop()


def api_post(api: str, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{api}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def run_deployment(api: str, deployment_id: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The UI's Custom run, waited for until its state is final."""
    created = api_post(api, f"/deployments/{deployment_id}/create_flow_run",
                       {"parameters": parameters})

    def final() -> dict[str, Any] | None:
        flow_run = httpx.get(f"{api}/flow_runs/{created['id']}", timeout=30).json()
        state = flow_run.get("state") or {}
        return flow_run if state.get("type") in ("COMPLETED", "FAILED", "CANCELLED",
                                                 "CRASHED") else None

    return wait_until(final, 300, f"flow run {created['name']} to finish", every=1.0)


def test_the_scaffold_holds_the_job_its_entry_point_a_prefect_yaml_and_a_test(
        team: dict[str, Any]) -> None:
    """`runledger init` in an empty folder writes what a team's repository needs."""
    folder: Path = team["folder"]
    for path in ("acme_jobs/team_digest.py", "tests/test_team_digest.py", "prefect.yaml",
                 "README.md", "pyproject.toml"):
        assert (folder / path).is_file(), path
    assert f'{JOB} = "acme_jobs.team_digest"' in (folder / "pyproject.toml").read_text()
    [wheel] = (folder / "wheels").glob("runledger-*.whl")  # copied in, named relatively
    assert f'path = "wheels/{wheel.name}"' in (folder / "pyproject.toml").read_text()
    assert "entrypoint: flows.entrypoints.run_job" in (folder / "prefect.yaml").read_text()


def test_a_deployment_from_the_teams_folder_completes_then_is_a_duplicate_listed_by_the_ui(
        team: dict[str, Any]) -> None:
    """Run twice from the team's deployment on a process worker: Completed, then Cached whose
    message says Duplicate; the deployment page's default filter (V1 by state names, V2 by
    state types) lists both runs."""
    api = team["api"]
    [deployment] = api_post(api, "/deployments/filter",
                            {"deployments": {"name": {"any_": [JOB]}}})
    assert deployment["entrypoint"] == "flows.entrypoints.run_job"
    first = run_deployment(api, deployment["id"], {"period": PERIOD})
    second = run_deployment(api, deployment["id"], {"period": PERIOD})
    assert first["state"]["name"] == "Completed", first["state"]
    assert second["state"]["name"] == "Cached", second["state"]
    assert second["state"]["message"].startswith(f"Duplicate: {JOB}/{PERIOD}: 2 duplicate")
    ids = {first["id"], second["id"]}
    by_deployment = {"deployments": {"id": {"any_": [deployment["id"]]}}}
    v1 = api_post(api, "/flow_runs/filter", {
        **by_deployment, "sort": "START_TIME_DESC", "limit": 50,
        "flow_runs": {"state": {"name": {"any_": V1_LISTED_NAMES}}}})
    v2 = api_post(api, "/flow_runs/paginate", {
        **by_deployment, "sort": "START_TIME_DESC", "limit": 10, "page": 1,
        "flow_runs": {"operator": "and_", "state": {"operator": "and_",
                                                   "type": {"any_": V2_LISTED_TYPES}}}})
    assert {r["id"] for r in v1} == ids
    assert {r["id"] for r in v2["results"]} == ids and v2["count"] == 2
    count = api_post(api, "/flow_runs/count", {
        **by_deployment, "flow_runs": {"state": {"name": {"any_": V1_LISTED_NAMES}}}})
    assert count == 2
    assert UUID(deployment["id"])


def test_check_from_the_teams_folder_passes_then_names_what_broke(team: dict[str, Any]) -> None:
    """`runledger check` in the team's environment: the job from its package, its deployment's
    schedule agreeing with the Job, the pool, the mail server: exit 0. A ledger URL pointing
    nowhere and a prefect.yaml naming a pool that does not exist: exit 1, each named with its
    fix. (Deleting the pool would not do: the running worker creates it again.)"""
    runledger = str(team["bin"] / "runledger")
    healthy = subprocess.run([runledger, "check"], cwd=team["folder"], env=team["env"],
                             capture_output=True, text=True, timeout=120)
    text = " ".join(healthy.stdout.split())
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert f"ok job {JOB} v1, daily in UTC: acme-jobs 0.1.0, entry point {JOB}" in text
    assert f"ok deployment {JOB}: job {JOB}, schedule agrees with its Job, pool runledger" in text
    assert "ok prefect.yaml" in text and "ok work pool" in text and "ok mail smtp" in text
    assert "competitor-summary" not in text  # runledger's examples stay out of a team's install
    broken_env = {**team["env"], "RUNLEDGER_DATABASE_URL": "sqlite:///elsewhere.db"}
    other = team["folder"] / "prod"
    other.mkdir()
    (other / "prefect.yaml").write_text(
        (team["folder"] / "prefect.yaml").read_text().replace("name: runledger\n",
                                                              "name: acme-prod\n"))
    broken = subprocess.run([runledger, "check", "--folder", str(other)], cwd=team["folder"],
                            env=broken_env, capture_output=True, text=True, timeout=120)
    text = " ".join(broken.stdout.split())
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "FAIL ledger no ledger at sqlite:///elsewhere.db" in text
    assert "FAIL work pool acme-prod does not exist" in text
    assert "prefect work-pool create acme-prod --type process" in text
    assert not (team["folder"] / "elsewhere.db").exists()


# A wheel, a fresh virtual environment and a server of its own: with make drills.
pytestmark = pytest.mark.skipif(os.environ.get("RUNLEDGER_FULL") != "1",
                                reason="builds a wheel and a fresh environment: RUNLEDGER_FULL=1")
