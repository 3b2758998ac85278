"""How a tick is cut into shards, the shard parameter a person may type, and how a shard
knows which one it is."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prefect.states import Completed, Failed

from flows.errors import InvalidJob
from flows.run_job.outcomes import over_budget_state
from flows.run_job.shards import (
    InvalidSharding,
    ended_over_budget,
    shard_key,
    shard_label_of,
    shard_size_for,
    split,
)
from store import RunIdentity
from tests.support.pipeline import probe_job

PERIOD = datetime(2026, 12, 1, tzinfo=UTC)


def pending(count: int) -> dict[str, RunIdentity]:
    return {f"s{i:03d}": RunIdentity("probe", f"s{i:03d}", PERIOD, "1") for i in range(count)}


@pytest.mark.parametrize(("subjects", "size", "sizes"), [
    (10, 5, [5, 5]), (11, 5, [4, 4, 3]), (2, 1, [1, 1]), (7, 100, [7]), (2000, 700, [667, 667, 666]),
])
def test_a_tick_is_cut_into_the_fewest_shards_of_even_size(
        subjects: int, size: int, sizes: list[int]) -> None:
    """No shard holds more than the shard size, the sizes differ by one at most, and every
    subject is in exactly one shard, in the tick's order."""
    shards = split(pending(subjects), size)
    assert [len(s.identities) for s in shards] == sizes
    assert [s.label for s in shards] == [f"{i}/{len(sizes)}" for i in range(1, len(sizes) + 1)]
    assert [subject for s in shards for subject in s.identities] == list(pending(subjects))


def test_the_run_parameter_wins_over_the_jobs_shard_size() -> None:
    """A Custom run's shard_size overrides the job's; empty, the job's own (none by default)."""
    assert shard_size_for(probe_job(shard_size=50).job, 20) == 20
    assert shard_size_for(probe_job(shard_size=50).job, None) == 50
    assert shard_size_for(probe_job().job, None) is None


@pytest.mark.parametrize("given", [0, -3, 2.5, "10", True])
def test_a_shard_size_that_is_not_a_whole_number_above_zero_is_refused_with_the_fix(
        given: object) -> None:
    """The error names the value and what to type instead."""
    with pytest.raises(InvalidSharding, match=r"shard_size must be a whole number of subjects, "
                                              r"1 or more, got .*; leave it empty"):
        shard_size_for(probe_job().job, given)


def test_a_job_with_a_shard_size_below_one_is_refused() -> None:
    """Job(shard_size=0) is an error when the job is defined, not when a tick runs."""
    with pytest.raises(InvalidJob, match="shard_size must be a whole number of subjects"):
        probe_job(shard_size=0)


@pytest.mark.parametrize("label", ["0/2", "3/2", "2", "a/b", "1/2/3", ""])
def test_a_shard_label_other_than_n_of_m_is_refused(label: str) -> None:
    """Only a sharded tick gives a shard its label, in the shard's idempotency key; anything
    but N/M with N <= M is refused, naming the form; a key of no shard is a tick's."""
    with pytest.raises(InvalidSharding, match=r"shard must be N/M \(shard N of M\)"):
        shard_label_of(shard_key("tick:1", label))
    assert shard_label_of(shard_key("tick:1", "2/4")) == "2/4"
    assert shard_label_of(None) is None and shard_label_of("review tick") is None


def test_a_shard_ended_over_budget_is_told_by_its_state_type_and_name_not_its_message() -> None:
    """Failed named OverBudget is over budget; a message that mentions it is not."""
    assert ended_over_budget(over_budget_state("probe/2026-12-01: 2 over-budget", None))
    assert not ended_over_budget(Failed(message="OverBudget: a subject's error quoted it"))
    assert not ended_over_budget(Completed(message="OverBudget: probe/2026-12-01"))
    assert not ended_over_budget(None)
