"""Which fault points a $RUNLEDGER_FAULTS value arms."""

from __future__ import annotations

import pytest

from store import InvalidInput
from store.faults import AFTER_COMPLETE_COMMIT, AFTER_MODEL_ANSWER, POINTS, armed_points


def test_a_listed_point_is_armed_for_its_first_passage_unless_a_count_is_given() -> None:
    """``name`` dies the first time there, ``name@N`` the Nth time; spaces and empties are ignored."""
    assert armed_points(f" {AFTER_COMPLETE_COMMIT}@3,, {AFTER_MODEL_ANSWER} ") == {
        AFTER_COMPLETE_COMMIT: 3, AFTER_MODEL_ANSWER: 1}
    assert armed_points("") == {}


@pytest.mark.parametrize("listed", ["after_complete_comit", f"{AFTER_MODEL_ANSWER}@0",
                                    f"{AFTER_MODEL_ANSWER}@twice"])
def test_an_unknown_point_or_a_bad_count_is_refused(listed: str) -> None:
    """A misspelt point would let a crash test pass without a crash: it is an error."""
    with pytest.raises(InvalidInput):
        armed_points(listed)


def test_the_point_names_are_unique() -> None:
    """Each constant names one place."""
    assert len(set(POINTS)) == len(POINTS)
