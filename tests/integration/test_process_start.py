"""What a process pays as it starts: the CLI, the flows and every deployment's entry point leave
the heavy dependencies they may never use (the providers' SDKs, prefect_aws with botocore: each
about half a second to a second of CPU) unimported until the code that needs them runs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("anthropic", "openai", "prefect_aws", "botocore", "boto3")
START = "import flows.cli, flows.entrypoints"
# Each step of one interpreter, after the start: what it runs.
STEPS = {
    "an OpenAI client": "from flows.model.providers import client_class; client_class('openai')",
    "an Anthropic client": "client_class('anthropic')",
    "an object target's block checked": "from flows.channels import channel_named; "
                                        "channel_named('object').block.block_type()",
}


def imported_after_each(steps: list[str]) -> list[list[str]]:
    """The heavy dependencies one fresh interpreter holds after each of ``steps`` in turn."""
    show = (f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "
            f"{set(HEAVY)!r})))")
    code = "\n".join(["import json, sys"] + [f"{step}\n{show}" for step in steps])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_cli_and_the_entry_points_start_without_the_sdks_or_prefect_aws() -> None:
    """Importing the CLI and every deployment's entry point imports none of them (the default
    model is the offline one)."""
    assert imported_after_each([START]) == [[]]


def test_each_heavy_dependency_is_imported_when_the_code_that_needs_it_runs() -> None:
    """Making an OpenAI client imports its SDK, an Anthropic client the anthropic SDK;
    checking an object target's block imports prefect_aws (with boto3 and botocore): each one
    then, none before."""
    after = imported_after_each([START, *STEPS.values()])
    new = {step: sorted(set(now) - set(before))
           for step, before, now in zip(STEPS, after[:-1], after[1:], strict=True)}
    assert after[0] == []
    assert new == {"an OpenAI client": ["openai"], "an Anthropic client": ["anthropic"],
                   "an object target's block checked": ["boto3", "botocore", "prefect_aws"]}
