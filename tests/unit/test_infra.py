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
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from prefect.client.schemas.objects import StateType
from prefect.settings.legacy import _get_valid_setting_names
from prefect.settings.models.root import Settings as PrefectSettings
from pydantic_settings import BaseSettings

from deployments.project import PROJECT_ROOT
from flows.stack.automations import CRASH_DETECTOR, HEARTBEAT_SECONDS, crash_detector
from flows.stack.processes import StackError

INFRA = PROJECT_ROOT / "infra"
COMPOSE = yaml.safe_load((INFRA / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
LONG_RUNNING = ("postgres", "prefect-server", "mailpit", "worker")


def _subclasses(cls: type) -> set[type]:
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
    """PostgreSQL, the Prefect server, Mailpit and the worker run with health checks; the
    workers wait for a successful one-shot setup."""
    assert set(LONG_RUNNING) <= set(SERVICES)
    for name in LONG_RUNNING:
        assert SERVICES[name]["healthcheck"]["test"], name
    worker = SERVICES["worker"]
    assert worker["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert worker["deploy"]["replicas"] >= 2
    assert "prefect deploy --all --prefect-file deployments/prefect.yaml" in " ".join(
        SERVICES["setup"]["command"]).replace("--no-prompt ", "")


def test_compose_runledger_variables_are_settings_of_the_project() -> None:
    """Every RUNLEDGER_* name in the compose file is read by one of the project's settings."""
    used = {n for n in environment_names() if n.startswith("RUNLEDGER_")}
    known = project_setting_names()
    assert {"RUNLEDGER_DATABASE_URL", "RUNLEDGER_SMTP_HOST", "RUNLEDGER_MAIL_FROM"} <= used
    assert used - known == set()


def test_compose_prefect_variables_are_prefect_settings() -> None:
    """Every PREFECT_* name in the compose file is a setting Prefect 3.9 knows."""
    used = {n for n in environment_names() if n.startswith("PREFECT_")}
    assert used and used - set(_get_valid_setting_names(PrefectSettings)) == set()


def test_the_ledger_and_prefect_use_separate_postgresql_databases() -> None:
    """Both tables sets have an alembic_version table: they cannot share one database."""
    ledger = SERVICES["worker"]["environment"]["RUNLEDGER_DATABASE_URL"]
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
    spec = importlib.util.spec_from_file_location("make_certs", INFRA / "make_certs.py")
    assert spec is not None and spec.loader is not None
    make_certs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_certs)
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
    assert trigger.after == {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"}
    assert trigger.expect == {"prefect.flow-run.*"}
    assert trigger.match_related.root["prefect.resource.id"] == "prefect.tag.runledger"
    assert trigger.within == timedelta(seconds=45)
    [action] = automation.actions
    assert action.state == StateType.CRASHED


def test_a_crash_detector_window_within_the_heartbeat_interval_is_refused() -> None:
    """A window shorter than the heartbeat interval would crash live flow runs."""
    with pytest.raises(StackError, match="heartbeat"):
        crash_detector(HEARTBEAT_SECONDS)
