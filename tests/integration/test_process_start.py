"""What a process pays as it starts: the CLI, the flows and every deployment's entry point leave
the heavy dependencies they may never use (the providers' SDKs, prefect_aws with botocore: each
about half a second to a second of CPU) unimported until the code that needs them runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("anthropic", "openai", "prefect_aws", "botocore", "boto3")
IMPORTED = (f"import json, sys; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}}"
            f" & {set(HEAVY)!r})))")
START = "import flows.cli, flows.entrypoints"


def heavy_imported(code: str) -> list[str]:
    """The heavy dependencies a fresh interpreter holds after running ``code``."""
    done = subprocess.run([sys.executable, "-c", f"{code}; {IMPORTED}"],
                          capture_output=True, text=True, check=True, timeout=120)
    imported: list[str] = json.loads(done.stdout)
    return imported


def test_the_cli_and_the_entry_points_start_without_the_sdks_or_prefect_aws() -> None:
    """Importing the CLI and every deployment's entry point imports none of them (the default
    model is the offline one)."""
    assert heavy_imported(START) == []


@pytest.mark.parametrize(("needed", "code"), [
    ("openai", "from flows.model.providers import client_class; client_class('openai')"),
    ("openai", "from flows.model.providers import batch_client_class; "
               "batch_client_class('openai')"),
    ("anthropic", "from flows.model.providers import client_class; client_class('anthropic')"),
    ("prefect_aws", "from flows.channels import channel_named; "
                    "channel_named('object').block.block_type()"),
    ("botocore", "from flows.channels import channel_named; from flows.channel import Opening; "
                 "c = channel_named('object'); c.open(c.settings(), Opening(60.0))"),
])
def test_a_heavy_dependency_is_imported_when_the_code_that_needs_it_runs(
        needed: str, code: str) -> None:
    """Making a provider's client (or Batch API client) imports its SDK; checking an object target's block imports
    prefect_aws; opening the object channel imports botocore."""
    assert needed in heavy_imported(f"{START}; {code}")
