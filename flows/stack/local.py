"""`runledger stack up`: the whole local stack from installed packages, no Docker.

It migrates the ledger, starts a Prefect server (SQLite in the stack folder, or PostgreSQL),
the SMTP sink writing .eml files, then either `runledger serve` (default) or a process work pool
with the deployments applied and N workers; it triggers one run of the reference job and one
delivery pass, prints where to look, and on Ctrl-C stops everything it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import sqlalchemy as sa

from flows.ports import free_port, port_is_free
from flows.registry import registered_jobs, upgrade_ledger
from flows.stack import commands
from flows.stack.auth import NO_AUTH, is_loopback
from flows.stack.automations import install_crash_detector
from flows.stack.config import (
    StackConfig,
    absolute_ledger_url,
    flow_env,
    prefect_database_for,
    shown_url,
)
from flows.stack.kickoff import (
    DELIVERY_DEPLOYMENT,
    REFERENCE_DEPLOYMENT,
    run_and_wait,
    wait_for_deployments,
)
from flows.stack.prefect_server import (
    PREFECT_DB_ENV,
    client,
    server_env,
    ui_url,
    wait_until_healthy,
)
from flows.stack.processes import StackError, Supervisor
from flows.stack.work_pool import ensure_pool
from store import Ledger, LedgerSettings, RunledgerError, create_database_if_missing

SINK_HOST = "127.0.0.1"
SERVER = "prefect-server"  # the child everything else needs: its exit stops the stack
Say = Callable[[str], None]


def running_stack(record: Path) -> dict[str, Any] | None:
    """What the stack recorded in ``record`` if its process still lives, else None."""
    try:
        found: dict[str, Any] = json.loads(record.read_text(encoding="utf-8"))
        cmdline = Path(f"/proc/{int(found['pid'])}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if b"stack" in cmdline else None  # not a reused pid


def refuse_second_stack(config: StackConfig, ledger_url: str) -> None:
    """A stack already running from this home, or a server on the port, is left alone and named:
    a second stack on the same ledger would run every schedule twice."""
    found = running_stack(config.record)
    if found is not None:
        raise StackError(
            f"a runledger stack is already running from {config.home} (pid {found['pid']}, "
            f"since {found['started']}): UI {found['ui']}, ledger {found['ledger']}. Use it, or "
            f"stop it with Ctrl-C in its terminal (or kill -INT {found['pid']}); it was left "
            "alone")
    if not port_is_free(config.host, config.port):
        raise StackError(
            f"port {config.port} on {config.host} is in use, by another Prefect server or a "
            f"stack started with another --home; nothing was started. A second stack on the "
            f"same ledger ({shown_url(ledger_url)}) would run every schedule twice: use the one "
            "running, or give this one its own RUNLEDGER_DATABASE_URL and --port")


def _mail_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.eml"))


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM end the stack through the same clean shutdown. SIGINT is set
    explicitly: a shell without job control starts background commands with it ignored."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Restarts:
    """When each child of the stack was started again lately: one that exits more than
    ``limit`` times within ``window`` seconds is crash-looping, and restarting it hides that."""

    limit: int = 5
    window: float = 300.0
    times: dict[str, list[float]] = field(default_factory=dict)

    def record(self, name: str, now: float) -> int | None:
        """Count a restart of ``name`` at ``now`` (monotonic seconds): its number within the
        window, or None (not counted) when the window already holds ``limit`` of them."""
        recent = [t for t in self.times.get(name, []) if now - t < self.window]
        if len(recent) >= self.limit:
            return None
        self.times[name] = [*recent, now]
        return len(recent) + 1


class LocalStack:
    """Starts and stops the local stack described by a StackConfig."""

    def __init__(self, config: StackConfig, say: Say = print) -> None:
        self.config = config
        self.say = say
        self.supervisor = Supervisor(config.log_dir)
        self.ledger_url = absolute_ledger_url(LedgerSettings().database_url)

    def start(self) -> None:
        config = self.config
        # Before anything starts: an exposed API without authentication is refused.
        config.auth.check(config.host)
        refuse_second_stack(config, self.ledger_url)
        for folder in (config.prefect_home, config.mail_dir, config.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        config.record.write_text(json.dumps({
            "pid": os.getpid(), "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "ui": ui_url(config.host, config.port), "ledger": self._shown_ledger()}))
        self._migrate()
        self._start_server()
        # The sink has no authentication and no TLS: it listens on loopback whatever --host is.
        self.smtp_port = free_port(SINK_HOST)
        self.supervisor.start("sink", self.sink_argv(), NO_AUTH.client_env(os.environ))
        env = flow_env(os.environ, config, self.ledger_url, self.smtp_port)
        if config.workers:
            self._start_workers(env)
        else:
            # Flow runs start in the folder the stack was started from, as a worker's would
            # in the folder `prefect deploy` ran in.
            self.supervisor.start("serve", commands.serve_argv(), env, cwd=Path.cwd())

    def sink_argv(self) -> list[str]:
        return commands.sink_argv(SINK_HOST, self.smtp_port, self.config.mail_dir)

    def _migrate(self) -> None:
        ledger = Ledger.connect(self.ledger_url)
        try:
            upgrade_ledger(ledger)
        finally:
            ledger.close()
        self.say(f"ledger migrated: {self._shown_ledger()}")

    def _start_server(self) -> None:
        config = self.config
        database = prefect_database_for(self.ledger_url, config.prefect_database_url)
        if database and not config.prefect_database_url:
            self._create_prefect_database(database)
        env = config.auth.server_env(server_env(os.environ, config.prefect_home, database,
                                                config.redis_url))
        events = f", events through Redis {shown_url(config.redis_url)}" if config.redis_url else ""
        self.say(f"starting the Prefect server on {ui_url(config.host, config.port)} "
                 f"({'PostgreSQL' if database else 'SQLite in ' + str(config.prefect_home)}"
                 f"{events})")
        server = self.supervisor.start(
            SERVER, commands.server_argv(config.host, config.port, ui=True), env)
        try:
            wait_until_healthy(config.api, server)
        except StackError as exc:
            if database and "does not exist" in server.log_tail():
                raise StackError(f"{exc}\nCreate Prefect's database first, e.g. `createdb` "
                                 f"{sa.engine.make_url(database).database}, or set "
                                 f"{PREFECT_DB_ENV}") from None
            raise
        with client(config.api, config.auth.value) as api:
            install_crash_detector(api, config.crash_after_seconds)
            # Also when serving: a team's `prefect deploy` to this server finds its pool.
            ensure_pool(api, config.pool)

    def _create_prefect_database(self, url: str) -> None:
        """Create the ``<ledger>_prefect`` database the stack chose; a user who may not create
        databases gets the server's own error and a hint instead."""
        name = sa.engine.make_url(url).database
        try:
            if create_database_if_missing(url):
                self.say(f"created Prefect's database {name}")
        except RunledgerError as exc:
            self.say(f"could not create Prefect's database {name}: {exc}")

    def _start_workers(self, env: dict[str, str]) -> None:
        config = self.config
        self.say(f"applying deployments/prefect.yaml to work pool {config.pool}")
        done = subprocess.run(commands.deploy_argv(pool=config.pool), env=env, cwd=Path.cwd(),
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise StackError(f"prefect deploy failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        for number in range(1, config.workers + 1):
            self.supervisor.start(f"worker-{number}",
                                  commands.worker_argv(config.pool, f"local-worker-{number}"), env)

    def kickoff(self, timeout: float = 300.0) -> None:
        """One run of the reference job, then one delivery pass, each waited for."""
        # The reference job is an example: a team's install without it kicks off delivery only.
        names = [REFERENCE_DEPLOYMENT, DELIVERY_DEPLOYMENT] if \
            REFERENCE_DEPLOYMENT in registered_jobs() else [DELIVERY_DEPLOYMENT]
        auth = self.config.auth
        ids = wait_for_deployments(self.config.api, names, timeout=120, auth=auth)
        for name in names:
            self.say(f"running {name} now ...")
            run = run_and_wait(self.config.api, ids[name], timeout, auth=auth)
            state = run.state
            self.say(f"  flow run {run.name}: {state.name if state else '?'}"
                     f"{' - ' + state.message if state and state.message else ''}")

    def banner(self) -> str:
        config = self.config
        mail = _mail_files(config.mail_dir)
        ledger_hint = "" if self.ledger_url == absolute_ledger_url(LedgerSettings().database_url) \
            else f"RUNLEDGER_DATABASE_URL={self._shown_ledger()} "
        mode = (f"{config.workers} worker(s) on work pool {config.pool}" if config.workers
                else "runledger serve (every deployment with its schedule)")
        return "\n".join([
            "",
            "runledger local stack is up",
            f"  Prefect UI   {ui_url(config.host, config.port)}   (flow runs, task runs, "
            "artifacts, events)",
            f"  mail folder  {config.mail_dir}   ({len(mail)} .eml file(s) so far)",
            f"  ledger       {self._shown_ledger()}",
            f"               {ledger_hint}runledger runs list   |   "
            f"{ledger_hint}runledger outbox list",
            f"  running      {mode}",
            f"  logs         {config.log_dir}",
            *self._auth_lines(),
            "Ctrl-C stops everything.",
        ])

    def _auth_lines(self) -> list[str]:
        """What a teammate needs to use the API (never the password itself)."""
        config = self.config
        if not config.auth.configured:
            return ["  API auth     none (loopback only; docs/security.md to share the stack)"]
        lines = [f"  API auth     basic, {config.auth.shown}: clients set PREFECT_API_URL="
                 f"{config.api} and PREFECT_API_AUTH_STRING to the same user:password"]
        if not is_loopback(config.host):
            lines.append("  warning      the API is plain HTTP: off this host the password "
                         "crosses the network in clear; put a TLS proxy in front "
                         "(docs/security.md)")
        return lines

    def _shown_ledger(self) -> str:
        return shown_url(self.ledger_url)

    def watch(self, poll_seconds: float = 1.0) -> None:
        """Block until Ctrl-C, SIGTERM, an exit of the Prefect server or a child's crash loop
        (an error). An exited serve or worker is started again and reported. The SMTP sink's
        exit is reported and the rest runs on: deliveries then fail and retry with backoff,
        which is what a person may want to watch."""
        reported: set[int] = set()
        restarts = Restarts()
        while True:
            for child in list(self.supervisor.children):
                if child.running() or child.pid in reported:
                    continue
                code = child.process.returncode
                if child.name == "sink":
                    reported.add(child.pid)
                    self.say(f"the SMTP sink exited ({code}); the rest of the stack runs on: "
                             "deliveries fail and retry with backoff (runledger outbox list). "
                             "Start it again in another terminal: runledger "
                             f"{' '.join(self.sink_argv()[-7:])}")
                    continue
                if child.name == SERVER:
                    raise StackError(f"the Prefect server exited ({code}); its log ends with:"
                                     f"\n{child.log_tail()}")
                count = restarts.record(child.name, time.monotonic())
                if count is None:
                    raise StackError(
                        f"{child.name} exited ({code}) {restarts.limit + 1} times within "
                        f"{restarts.window:g} s; its log ends with:\n{child.log_tail()}")
                again = self.supervisor.restart(child)
                self.say(f"{child.name} exited ({code}); started it again as pid {again.pid} "
                         f"(restart {count} of at most {restarts.limit} within "
                         f"{restarts.window:g} s; log {child.log})")
            time.sleep(poll_seconds)

    def stop(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if not self.supervisor.children:  # refused before anything started: say nothing
                return
            self.say("stopping the stack ...")
            stragglers = self.supervisor.stop()
            self.say("stopped" + (f" (killed {len(stragglers)} leftover process(es))"
                                  if stragglers else ""))
        finally:
            with contextlib.suppress(OSError, ValueError, KeyError):  # only our own record
                if json.loads(self.config.record.read_text())["pid"] == os.getpid():
                    self.config.record.unlink()
            signal.signal(signal.SIGINT, previous)


def up(config: StackConfig, say: Say = print) -> None:
    """Start the stack, kick it off, print where to look, and run until Ctrl-C."""
    config.auth.check(config.host)  # before any folder, process or port is touched
    stack = LocalStack(config, say)
    with _stop_on_signals():
        try:
            stack.start()
            if config.kickoff:
                stack.kickoff()
            say(stack.banner())
            stack.watch()
        except KeyboardInterrupt:
            pass
        finally:
            stack.stop()
