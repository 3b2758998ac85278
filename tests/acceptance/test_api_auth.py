"""The Prefect API behind basic authentication: `runledger stack up --host 0.0.0.0 --workers 1`
with PREFECT_SERVER_API_AUTH_STRING set, a real `prefect server`, a real worker and
`runledger run`. Unauthenticated calls are refused; the string never shows up anywhere a person
or another tenant of the server could read it."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.ports import free_port
from flows.stack import commands
from flows.stack.auth import CLIENT_AUTH_ENV, SERVER_AUTH_ENV
from tests.support.stack import wait_for_banner

PASSWORD = "s3cr3t-" + os.urandom(12).hex()
SECRET = f"admin:{PASSWORD}"
TOKEN = base64.b64encode(SECRET.encode()).decode()
# What must never be readable: the string, its password and the Authorization header's token.
NEEDLES = (SECRET, PASSWORD, TOKEN)


@dataclass
class AuthStack:
    process: subprocess.Popen[str]
    folder: Path
    api: str
    banner: str
    cli_outputs: list[str]

    def env(self, auth: str | None) -> dict[str, str]:
        """The environment of a `runledger` command run by a teammate against this stack."""
        env = {k: v for k, v in os.environ.items() if k not in (SERVER_AUTH_ENV, CLIENT_AUTH_ENV)}
        env.update(PREFECT_API_URL=self.api,
                   RUNLEDGER_DATABASE_URL=f"sqlite:///{self.folder}/runledger.db",
                   RUNLEDGER_MODEL="offline")
        if auth is not None:
            env[CLIENT_AUTH_ENV] = auth
        return env

    def api_post(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        response = httpx.post(f"{self.api}{path}", json=body, timeout=30,
                              headers={"Authorization": f"Basic {TOKEN}"})
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found


@pytest.fixture(scope="module")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    """The stack on every interface with the auth string set for the server only (the stack
    gives its clients the same string), the reference job and one delivery pass kicked off."""
    folder = tmp_path_factory.mktemp("auth-stack")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", CLIENT_AUTH_ENV)}
    env.update({SERVER_AUTH_ENV: SECRET, "RUNLEDGER_DATABASE_URL":
                f"sqlite:///{folder}/runledger.db", "RUNLEDGER_MODEL": "offline"})
    process = subprocess.Popen(
        commands.runledger_argv("stack", "up", "--home", str(folder / "home"), "--host",
                                "0.0.0.0", "--port", str(port), "--workers", "1"),
        env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        banner = wait_for_banner(process, timeout=420)
        yield AuthStack(process, folder, f"http://127.0.0.1:{port}/api", banner, [banner])
        os.kill(process.pid, signal.SIGINT)
        assert process.wait(90) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_an_unauthenticated_or_wrongly_authenticated_api_call_is_refused_with_401(
        auth_stack: AuthStack) -> None:
    """No Authorization header, a wrong password or another scheme: 401 on reads and on
    starting a run; only the health probe answers without credentials."""
    wrong = base64.b64encode(b"admin:not-the-password").decode()
    for headers in ({}, {"Authorization": f"Basic {wrong}"}, {"Authorization": f"Bearer {TOKEN}"}):
        for path in ("/flow_runs/filter", "/deployments/filter", "/artifacts/filter"):
            response = httpx.post(f"{auth_stack.api}{path}", json={}, headers=headers, timeout=30)
            assert response.status_code == 401, (path, headers, response.text)
    assert httpx.get(f"{auth_stack.api}/health", timeout=30).status_code == 200
    assert auth_stack.api_post("/deployments/filter", {})  # the right string is let in


def test_the_worker_given_the_string_ran_the_reference_job_and_delivered_its_mail(
        auth_stack: AuthStack) -> None:
    """The stack's worker (with PREFECT_API_AUTH_STRING from the stack) ran both kicked-off
    flow runs to Completed (the tick a Duplicate when the 5-minute reconcile, due as the worker
    started, completed today's period first), and the sink has the emails."""
    assert "flow run" in auth_stack.banner
    finished = [line for line in auth_stack.banner.splitlines() if line.strip().startswith("flow run")]
    assert len(finished) == 2, auth_stack.banner
    assert all(": Completed" in line or ": Cached - Duplicate: " in line for line in finished), \
        auth_stack.banner
    assert sorted((auth_stack.folder / "home" / "mail").glob("*.eml"))
    assert "admin:****" in auth_stack.banner and "plain HTTP" in auth_stack.banner


@pytest.fixture(scope="module")
def cli_runs(auth_stack: AuthStack) -> tuple[subprocess.CompletedProcess[str],
                                        subprocess.CompletedProcess[str]]:
    """`runledger run` of a new period without the string, then with it (outputs kept)."""
    argv = commands.runledger_argv("run", "competitor-summary", "--period", "2026-02-02",
                                   "--subject", "acme", "--json")
    runs = []
    for auth in (None, SECRET):
        done = subprocess.run(argv, env=auth_stack.env(auth), cwd=auth_stack.folder, capture_output=True,
                              text=True, timeout=300)
        auth_stack.cli_outputs.append(done.stdout + done.stderr)
        runs.append(done)
    return runs[0], runs[1]


def test_runledger_run_works_with_the_string_and_is_refused_without_it(
        cli_runs: tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]
) -> None:
    """`runledger run` against the server: without PREFECT_API_AUTH_STRING it fails in one
    line naming the 401 and the variable to set; with it, it completes the new period."""
    refused, done = cli_runs
    assert refused.returncode == 1
    assert refused.stderr.strip().replace("\n", " ").startswith(
        "error: the Prefect server at http://127.0.0.1:")
    assert "(401 Unauthorized): set PREFECT_API_AUTH_STRING" in refused.stderr.replace("\n", " ")
    assert "Traceback" not in refused.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    [subject] = json.loads(done.stdout)["subjects"]
    assert subject["outcome"] == "new"


def test_stack_automations_needs_the_string_too(auth_stack: AuthStack) -> None:
    """`runledger stack automations` (compose's setup runs it) is refused in one line without
    PREFECT_API_AUTH_STRING and installs the crash detector with it."""
    argv = commands.runledger_argv("stack", "automations")
    refused = subprocess.run(argv, env=auth_stack.env(None), capture_output=True, text=True,
                             timeout=120)
    done = subprocess.run(argv, env=auth_stack.env(SECRET), capture_output=True, text=True,
                          timeout=120)
    auth_stack.cli_outputs += [refused.stdout + refused.stderr, done.stdout + done.stderr]
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "(401 Unauthorized): set PREFECT_API_AUTH_STRING" in refused.stderr.replace("\n", " ")
    assert done.returncode == 0 and "installed the crash detector" in done.stdout


def test_the_auth_string_never_appears_in_logs_errors_parameters_or_artifacts(
        auth_stack: AuthStack, cli_runs: Any) -> None:
    """Neither the string, its password nor the basic-auth token is in any log file of the
    stack (server, worker, sink), any CLI output, or what the API shows: flow runs (parameters,
    job variables, states), deployments, artifacts, logs, variables and events."""
    readable = [p.read_text(errors="replace") for p in (auth_stack.folder / "home").rglob("*.log")]
    assert readable, "the stack wrote no logs"
    readable += auth_stack.cli_outputs
    for path in ("/flow_runs/filter", "/deployments/filter", "/artifacts/filter",
                 "/logs/filter", "/variables/filter", "/task_runs/filter"):
        found = auth_stack.api_post(path, {"limit": 200})
        readable.append(json.dumps(found))
        if path == "/flow_runs/filter":
            assert len(found) >= 3 and any(run["parameters"] for run in found)
        if path == "/artifacts/filter":
            assert found, "the runs made no artifacts to check"
    events = httpx.post(f"{auth_stack.api}/events/filter", json={"limit": 200}, timeout=30,
                        headers={"Authorization": f"Basic {TOKEN}"})
    readable.append(events.text)
    for text in readable:
        for needle in NEEDLES:
            assert needle not in text
