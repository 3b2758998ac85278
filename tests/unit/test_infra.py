"""infra/: the compose file's structure and environment names (no Docker engine here), the
worker image, the sink certificate, and the crash detector automation."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pkgutil
import re
import ssl
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger
from prefect.events.schemas.events import ResourceSpecification
from prefect.settings.legacy import _get_valid_setting_names
from prefect.settings.models.root import Settings as PrefectSettings
from prefect_redis.client import RedisMessagingSettings
from pydantic_settings import BaseSettings

from deployments.project import PROJECT_ROOT
from flows.stack.automations import CRASH_DETECTOR, HEARTBEAT_SECONDS, crash_detector
from flows.stack.processes import StackError

INFRA = PROJECT_ROOT / "infra"
COMPOSE_TEXT = (INFRA / "compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
LONG_RUNNING = ("postgres", "redis", "prefect-server", "mailpit", "worker")
# ${NAME:?message}: compose refuses to start without NAME (from infra/.env) and says why.
REQUIRED = re.compile(r"\$\{(\w+):\?([^}]*)\}")

T = TypeVar("T")


def _subclasses(cls: type[T]) -> set[type[T]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def project_setting_names() -> set[str]:
    """Every environment variable a pydantic-settings class of store/ or flows/ reads."""
    for package in ("store", "flows"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            importlib.import_module(info.name)
    names: set[str] = set()
    for cls in _subclasses(BaseSettings):
        if not cls.__module__.startswith(("store.", "flows.")):
            continue
        prefix = cls.model_config.get("env_prefix", "")
        for field_name, field in cls.model_fields.items():
            alias = field.validation_alias
            names.add((alias if isinstance(alias, str) else prefix + field_name).upper())
    return names


def environment_names() -> set[str]:
    return {name for service in SERVICES.values() for name in service.get("environment", {})}


def test_the_compose_file_has_the_whole_stack_with_health_checks() -> None:
    """PostgreSQL, Redis, the Prefect server, Mailpit and the worker run with health checks; the
    workers wait for a successful one-shot setup."""
    assert set(LONG_RUNNING) <= set(SERVICES)
    for name in LONG_RUNNING:
        assert SERVICES[name]["healthcheck"]["test"], name
    worker = SERVICES["worker"]
    assert worker["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert worker["deploy"]["replicas"] >= 2
    assert "prefect deploy --all --prefect-file deployments/prefect.yaml" in " ".join(
        SERVICES["setup"]["command"]).replace("--no-prompt ", "")


def _load_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, INFRA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interpolate(value: str, env: dict[str, str]) -> str:
    """``value`` as docker compose reads it with ``env`` as infra/.env."""
    return REQUIRED.sub(lambda m: env[m.group(1)], value)


def test_every_published_port_is_bound_to_loopback() -> None:
    """The Prefect API/UI and Mailpit's UI are published on 127.0.0.1 only, never on every
    interface of the host; nothing else is published."""
    published = {name: service.get("ports", []) for name, service in SERVICES.items()}
    assert published["prefect-server"] == ["127.0.0.1:4200:4200"]
    assert published["mailpit"] == ["127.0.0.1:8025:8025"]
    for name, ports in published.items():
        for port in ports:
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
            assert len(port.split(":")) == 3, (name, port)


def test_the_prefect_api_requires_its_auth_string_from_every_client() -> None:
    """The server sets PREFECT_SERVER_API_AUTH_STRING and every service that talks to the API
    (setup, workers) sends the same value as PREFECT_API_AUTH_STRING, from infra/.env."""
    server = SERVICES["prefect-server"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_AUTH_STRING:?")
    clients = [name for name, s in SERVICES.items() if "PREFECT_API_URL" in s.get("environment", {})]
    assert {"setup", "worker"} <= set(clients)
    for name in clients:
        env = SERVICES[name]["environment"]
        assert env["PREFECT_API_AUTH_STRING"] == server["PREFECT_SERVER_API_AUTH_STRING"], name


def test_no_secret_is_written_in_the_compose_file() -> None:
    """Every password and the auth string is a required ${...} value from infra/.env with a
    message naming infra/make_env.py; resolved, each URL carries that password."""
    values = {"LEDGER_DB_PASSWORD": "pw-ledger", "WORKER_DB_PASSWORD": "pw-worker",
              "PREFECT_AUTH_STRING": "admin:pw-prefect"}
    assert "runledger:runledger@" not in COMPOSE_TEXT
    for name, message in REQUIRED.findall(COMPOSE_TEXT):
        assert name in values and "infra/make_env.py" in message, name
    assert set(values) == {m[0] for m in REQUIRED.findall(COMPOSE_TEXT)}
    for service_name, service in SERVICES.items():
        for key, raw in service.get("environment", {}).items():
            if any(word in key for word in ("PASSWORD", "AUTH_STRING")):
                assert REQUIRED.fullmatch(str(raw)), (service_name, key)
            if str(raw).startswith("postgresql"):
                url = sa.engine.make_url(interpolate(str(raw), values))
                assert url.password in ("pw-ledger", "pw-worker"), (service_name, key)
    worker = sa.engine.make_url(interpolate(
        SERVICES["worker"]["environment"]["RUNLEDGER_DATABASE_URL"], values))
    setup = sa.engine.make_url(interpolate(
        SERVICES["setup"]["environment"]["RUNLEDGER_DATABASE_URL"], values))
    assert (worker.username, worker.password) == ("runledger_worker", "pw-worker")
    assert (setup.username, setup.password) == ("runledger", "pw-ledger")


def test_the_workers_use_the_least_privilege_role_granted_after_each_upgrade() -> None:
    """PostgreSQL makes the runledger_worker role on first start; setup migrates as the owner
    and then applies infra/worker-grants.sql for that role."""
    script = " ".join(SERVICES["setup"]["command"])
    assert script.index("runledger db upgrade") < script.index("python infra/apply_grants.py")
    init = (INFRA / "postgres-worker-role.sh").read_text()
    assert "CREATE ROLE runledger_worker LOGIN PASSWORD :'password'" in init
    mounts = SERVICES["postgres"]["volumes"]
    assert "./postgres-worker-role.sh:/docker-entrypoint-initdb.d/20-worker-role.sh:ro" in mounts
    assert _load_module("apply_grants").ROLE == "runledger_worker"


def test_make_env_writes_fresh_random_secrets_readable_by_the_owner_only(tmp_path: Path) -> None:
    """infra/make_env.py writes every name compose requires, each random, the auth string as
    user:password, mode 0600; it keeps an existing file; infra/.env is never committed nor
    copied into the image; infra/.env.example documents the same names."""
    make_env = _load_module("make_env")
    target = tmp_path / ".env"
    assert make_env.write_env(target)
    first = dict(line.split("=", 1) for line in target.read_text().splitlines()
                 if line and not line.startswith("#"))
    assert set(first) == {m[0] for m in REQUIRED.findall(COMPOSE_TEXT)}
    assert (target.stat().st_mode & 0o777) == 0o600
    assert re.fullmatch(r"admin:[0-9a-f]{32}", first["PREFECT_AUTH_STRING"])
    assert len(set(first.values())) == len(first)
    assert not make_env.write_env(target) and make_env.write_env(target, force=True)
    second = dict(line.split("=", 1) for line in target.read_text().splitlines()
                  if line and not line.startswith("#"))
    assert not set(first.values()) & set(second.values())
    example = (INFRA / ".env.example").read_text()
    assert {line.split("=", 1)[0] for line in example.splitlines()
            if line and not line.startswith("#")} == set(first)
    assert "infra/.env" in (PROJECT_ROOT / ".gitignore").read_text().splitlines()
    assert "**/.env" in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()


def test_compose_runledger_variables_are_settings_of_the_project() -> None:
    """Every RUNLEDGER_* name in the compose file is read by one of the project's settings."""
    used = {n for n in environment_names() if n.startswith("RUNLEDGER_")}
    known = project_setting_names()
    assert {"RUNLEDGER_DATABASE_URL", "RUNLEDGER_SMTP_HOST", "RUNLEDGER_MAIL_FROM"} <= used
    assert used - known == set()


def test_compose_prefect_variables_are_prefect_settings() -> None:
    """Every PREFECT_* name in the compose file is a setting Prefect 3.9 or prefect-redis's
    messaging knows."""
    used = {n for n in environment_names() if n.startswith("PREFECT_")}
    known = {*_get_valid_setting_names(PrefectSettings),
             *_get_valid_setting_names(RedisMessagingSettings)}
    assert used and used - known == set()


def test_the_compose_server_sends_its_events_through_redis() -> None:
    """The Prefect server's broker and cache are prefect-redis's, on the compose Redis, which it
    waits for; the server runs the runledger image, whose lock includes prefect-redis."""
    server = SERVICES["prefect-server"]
    env = server["environment"]
    assert env["PREFECT_MESSAGING_BROKER"] == env["PREFECT_MESSAGING_CACHE"] == (
        "prefect_redis.messaging")
    assert env["PREFECT_REDIS_MESSAGING_URL"].startswith("redis://redis:6379/")
    assert server["depends_on"]["redis"]["condition"] == "service_healthy"
    assert server["image"] == SERVICES["worker"]["image"]
    assert "prefect-redis" in (PROJECT_ROOT / "uv.lock").read_text()


def test_the_ledger_and_prefect_use_separate_postgresql_databases() -> None:
    """Both tables sets have an alembic_version table: they cannot share one database."""
    for service in ("worker", "setup"):
        ledger = SERVICES[service]["environment"]["RUNLEDGER_DATABASE_URL"]
        prefect = SERVICES["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
        assert ledger.rsplit("/", 1)[1] != prefect.rsplit("/", 1)[1]
    assert "CREATE DATABASE prefect" in (INFRA / "postgres-init.sql").read_text()


def test_the_worker_image_contains_every_package_of_the_project() -> None:
    """The Dockerfile copies each package the wheel ships, and the lock file."""
    build = SERVICES["worker"]["build"]
    dockerfile = (INFRA / build["dockerfile"].removeprefix("infra/")).read_text()
    assert (INFRA / build["context"]).resolve() == PROJECT_ROOT
    packages = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())[
        "tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, re.MULTILINE))
    assert set(packages) <= copied and "uv sync --frozen" in dockerfile


def test_the_sink_certificate_verifies_for_its_host_name(tmp_path: Path) -> None:
    """The certificate made for Mailpit passes a verifying TLS handshake for "mailpit" when
    the client trusts it as RUNLEDGER_SMTP_CA_FILE does, and fails for another name."""
    make_certs = _load_module("make_certs")
    cert, key = make_certs.make_certificate(tmp_path, ["mailpit"])

    def handshake(host: str) -> None:
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))
        to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_context.wrap_bio(to_client, to_server, server_hostname=host)
        server = server_context.wrap_bio(to_server, to_client, server_side=True)
        for _ in range(10):
            for side in (client, server):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            if client.version() and server.version():
                return
        raise AssertionError("the TLS handshake did not finish")

    handshake("mailpit")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake("mail.example.org")


def test_the_crash_detector_treats_every_flow_run_event_as_a_sign_of_life() -> None:
    """It watches runledger flow runs only, starts on Running or a heartbeat, accepts any
    flow-run event (custom state names included) and marks a silent run Crashed."""
    automation = crash_detector(45)
    trigger = automation.trigger
    assert automation.name == CRASH_DETECTOR
    assert isinstance(trigger, EventTrigger)
    assert trigger.after == {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"}
    assert trigger.expect == {"prefect.flow-run.*"}
    assert isinstance(trigger.match_related, ResourceSpecification)
    assert trigger.match_related.root["prefect.resource.id"] == "prefect.tag.runledger"
    assert trigger.within == timedelta(seconds=45)
    [action] = automation.actions
    assert isinstance(action, ChangeFlowRunState)
    assert action.state == StateType.CRASHED


def test_a_crash_detector_window_within_the_heartbeat_interval_is_refused() -> None:
    """A window shorter than the heartbeat interval would crash live flow runs."""
    with pytest.raises(StackError, match="heartbeat"):
        crash_detector(HEARTBEAT_SECONDS)
