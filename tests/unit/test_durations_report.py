"""The suite's durations summary (tests/support/durations.py) groups test time as xdist ran it."""

from __future__ import annotations

from tests.support.durations import UNGROUPED, Case, compare, render, totals


def test_the_xdist_group_is_the_suffix_after_the_parameters_and_an_email_is_no_group() -> None:
    """``name[...]@acceptance`` is in group acceptance; an ``@`` inside the parameters is not."""
    cases = [Case("tests.acceptance.test_a", "test_x[one]@acceptance", 1.0),
             Case("tests.integration.test_b", "test_y[ops@example.com]", 2.0),
             Case("tests.unit.test_c", "test_z", 3.0)]
    assert [c.group for c in cases] == ["acceptance", UNGROUPED, UNGROUPED]
    assert [c.layer for c in cases] == ["acceptance", "integration", "unit"]


def test_totals_sum_each_group_and_put_the_largest_first() -> None:
    """Two hosts tests of 4 s and 5 s sum to 9 s, ahead of one 2 s acceptance test."""
    cases = [Case("tests.hosts.test_h", "a@hosts", 4.0), Case("tests.hosts.test_h", "b@hosts", 5.0),
             Case("tests.acceptance.test_a", "c@acceptance", 2.0)]
    assert totals(cases, "group") == [("hosts", 2, 9.0), ("acceptance", 1, 2.0)]


def test_the_summary_names_the_wall_time_and_the_slowest_test_first() -> None:
    """The first line compares summed test time with the wall time; the slowest list is sorted."""
    cases = [Case("tests.unit.test_u", "fast", 0.5), Case("tests.unit.test_u", "slow", 7.0)]
    text = render(5.0, cases, top=2)
    assert text.splitlines()[0] == "2 tests, 8 s of test time in 5 s of wall time"
    slowest = text.split("slowest 2 tests:\n")[1].splitlines()
    assert [line.split("::")[1] for line in slowest] == ["slow", "fast"]


def test_a_comparison_shows_each_group_of_both_runs_and_the_ratio_of_their_times() -> None:
    """A group that took 10 s before and 4 s after reads x0.40; one only in the later run
    reads from 0 tests and 0 s, with no ratio."""
    before = (20.0, [Case("tests.acceptance.test_a", "a@acceptance", 10.0)])
    after = (8.0, [Case("tests.acceptance.test_a", "a@acceptance", 4.0),
                   Case("tests.hosts.test_h", "h@hosts", 3.0)])
    lines = compare(before, after).splitlines()
    assert lines[1].split() == ["wall", "time", "1", "->", "2", "tests", "20.0", "s", "->", "8.0",
                                "s", "x0.40"]
    groups = lines[lines.index("by xdist group:") + 1:]
    assert [line.split()[0] for line in groups] == ["acceptance", "hosts"]
    assert groups[0].split()[-1] == "x0.40" and groups[1].split()[-1] == "x-"
