"""The generated reference pages (docs/gen_reference.py): every environment variable the code
reads is in the settings reference, and the other pages name what the code defines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(gen: ModuleType) -> dict[str, str]:
    return gen.pages()  # type: ignore[no-any-return]


def test_every_runledger_variable_the_code_reads_is_in_the_settings_reference(
        gen: ModuleType, pages: dict[str, str]) -> None:
    """Each full RUNLEDGER_* name in a string literal of store/, flows/, deployments/, bench/ or
    tests/ (or in infra/, .ci/run, the Makefile) appears, in code, on the settings page."""
    found = gen.env_names_in_code()
    assert {"RUNLEDGER_DATABASE_URL", "RUNLEDGER_FAULTS", "RUNLEDGER_MAIL_FROM"} <= set(found)
    page = pages["reference/settings.md"]
    missing = {name: sorted(where) for name, where in found.items() if f"`{name}`" not in page}
    assert missing == {}, "add these to the settings classes (with description=) or to " \
                          "OTHER_VARIABLES in docs/gen_reference.py"


def test_every_settings_field_is_in_the_settings_reference_with_its_description(
        gen: ModuleType, pages: dict[str, str]) -> None:
    """Each field of every pydantic-settings class is a row: its variable and its description."""
    page = pages["reference/settings.md"]
    classes = gen.settings_classes()
    assert len(classes) >= 7
    for cls in classes:
        for name, field in cls.model_fields.items():
            row = next(line for line in page.splitlines()
                       if line.startswith(f"| `{gen.env_name(cls, name, field)}` |"))
            assert field.description and gen._rst_to_md(field.description).split()[0] in row


def test_a_prefix_is_not_taken_for_a_variable(gen: ModuleType, tmp_path: Path) -> None:
    """`RUNLEDGER_SMTP_*` and `RUNLEDGER_SMTP_` in prose are prefixes, not variable names."""
    ours = "RUNLEDGER" + "_"  # not one literal: this file is scanned too
    package = tmp_path / "store"
    package.mkdir()
    (package / "m.py").write_text(f'"""Reads {ours}SMTP_* and {ours}X_Y."""\n'
                                  f'PREFIX = "{ours}SMTP_"\n{ours}TAG = "tag"\n')
    assert set(gen.env_names_in_code(tmp_path)) == {f"{ours}X_Y"}


def test_the_cli_reference_has_every_command(pages: dict[str, str]) -> None:
    """Every command of the Typer app has a section, nested groups included."""
    import typer

    import flows.cli  # noqa: F401  (registers the commands)
    from flows.cli.app import app

    root = typer.main.get_command(app)
    page = pages["reference/cli.md"]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        assert f"## `runledger {name}`" in page
        for sub in getattr(command, "commands", {}):
            assert f"## `runledger {name} {sub}`" in page


def test_the_states_page_names_every_state_event_and_artifact(pages: dict[str, str]) -> None:
    """The state names and events of flows/run_job/outcomes.py, the outbox events and the artifact
    keys (tick, status board, delivery) are on the states page."""
    from flows.delivery.flow import ARTIFACT_KEY
    from flows.run_job.outcomes import EVENTS, STATE_NAMES

    page = pages["reference/states-events.md"]
    for name in [*STATE_NAMES.values(), *EVENTS.values(), "runledger.outbox.uncertain",
                 "competitor-summary-tick", "runledger-status-competitor-summary", ARTIFACT_KEY]:
        assert f"`{name}`" in page


def test_the_api_page_documents_every_public_name_of_store(pages: dict[str, str]) -> None:
    """One mkdocstrings block (or constant) per name of store.__all__."""
    import store

    page = pages["reference/api.md"]
    for name in store.__all__:
        assert f"::: store.{name}\n" in page or f"### `{name}`" in page


def test_the_settings_reference_names_every_fault_point(pages: dict[str, str]) -> None:
    """The generated settings page lists the names RUNLEDGER_FAULTS accepts."""
    from store.faults import POINTS

    assert all(f"`{point}`" in pages["reference/settings.md"] for point in POINTS)


def test_the_fault_points_page_lists_every_named_point_once() -> None:
    """docs/how-to/fault-points.md has one table row per constant in store/faults.py."""
    from store.faults import POINTS

    page = (ROOT / "docs" / "how-to" / "fault-points.md").read_text(encoding="utf-8")
    rows = [line.split("`")[1] for line in page.splitlines() if line.startswith("| `")]
    assert sorted(rows) == sorted(POINTS)
