"""Which tests share one pytest-xdist worker (tests/conftest.py): the acceptance tests on the
shared stack, and the host drills; every other test runs on any worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import TESTS, xdist_group


@dataclass
class Collected:
    """What the grouping reads of a collected test: its file and its fixtures."""

    path: Path
    fixturenames: list[str] = field(default_factory=list)


def group_of(path: str, *fixtures: str) -> str | None:
    return xdist_group(cast("pytest.Item", cast("Any", Collected(TESTS / path, list(fixtures)))))


def test_an_acceptance_test_on_the_shared_stack_is_in_the_acceptance_group() -> None:
    """The shared stack starts once, on the worker that runs the group."""
    assert group_of("acceptance/test_end_to_end.py", "stack", "tmp_path") == "acceptance"


def test_an_acceptance_test_that_starts_a_stack_of_its_own_runs_on_any_worker() -> None:
    """API auth, the local stack and the installed package start their own."""
    assert group_of("acceptance/test_api_auth.py", "auth_stack") is None
    assert group_of("acceptance/test_local_stack.py", "tmp_path") is None


def test_every_host_drill_is_in_the_hosts_group_and_other_layers_in_none() -> None:
    """Two network-namespace clusters never run at once; unit, integration and drill tests
    take whichever worker is free."""
    assert group_of("hosts/test_hosts.py", "tmp_path") == "hosts"
    assert [group_of(f"{layer}/test_x.py", "stack") for layer in
            ("unit", "integration", "drills")] == [None, None, None]
