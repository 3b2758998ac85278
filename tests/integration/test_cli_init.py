"""`runledger init --runledger ...`: a team's pyproject.toml names runledger by a path inside
(or relative to) the team's repository, never by an absolute path of one machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from flows.cli import app

WHEEL = "runledger-0.1.0-py3-none-any.whl"


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """An empty folder for the team's repository."""
    folder = tmp_path / "acme-jobs"
    folder.mkdir()
    return folder


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    """A wheel file outside the team's folder (its bytes are what init must copy)."""
    built = tmp_path / "dist" / WHEEL
    built.parent.mkdir()
    built.write_bytes(b"PK\x03\x04 a wheel's bytes")
    return built


def init(folder: Path, runledger: str) -> Result:
    return CliRunner().invoke(app, ["init", "--job", "team-digest", "--runledger", runledger,
                                    "--folder", str(folder)], catch_exceptions=False)


def test_a_wheel_is_copied_into_the_repository_and_named_by_a_relative_path(
        team: Path, wheel: Path) -> None:
    """The wheel lands in wheels/ with the same bytes; pyproject.toml's uv source is
    wheels/<name>, and no absolute path is written anywhere in it."""
    done = init(team, str(wheel))
    assert done.exit_code == 0, done.output
    copy = team / "wheels" / WHEEL
    assert copy.read_bytes() == wheel.read_bytes()
    pyproject = (team / "pyproject.toml").read_text()
    assert f'runledger = {{ path = "wheels/{WHEEL}" }}' in pyproject
    assert 'dependencies = ["runledger"]' in pyproject
    assert str(wheel.parent) not in pyproject and str(team) not in pyproject
    assert f"copied   wheels/{WHEEL}" in done.stdout


def test_a_missing_wheel_is_refused_with_nothing_written(team: Path, tmp_path: Path) -> None:
    """A .whl path that is not a file: exit 2, one line naming it, the folder left empty."""
    done = init(team, str(tmp_path / WHEEL))
    assert done.exit_code == 2
    assert f"--runledger {tmp_path / WHEEL}: no such wheel file; nothing was written" in (
        done.stderr)
    assert list(team.iterdir()) == []


def test_a_checkout_is_named_relative_to_the_repository(team: Path, tmp_path: Path) -> None:
    """A runledger checkout beside the team's folder: ``path = "../runledger"``."""
    checkout = tmp_path / "runledger"
    checkout.mkdir()
    done = init(team, str(checkout))
    assert done.exit_code == 0, done.output
    assert 'runledger = { path = "../runledger" }' in (team / "pyproject.toml").read_text()


def test_an_existing_pyproject_is_appended_to_and_told_how_to_add_the_copied_wheel(
        team: Path, wheel: Path) -> None:
    """A repository with its own pyproject.toml: the entry point is appended, the wheel copied,
    and the line says `uv add ./wheels/<name>`."""
    (team / "pyproject.toml").write_text('[project]\nname = "acme-jobs"\nversion = "1"\n')
    done = init(team, str(wheel))
    assert done.exit_code == 0, done.output
    assert (team / "wheels" / WHEEL).is_file()
    assert f"uv add ./wheels/{WHEEL}" in done.stdout
