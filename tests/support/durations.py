"""Where the suite's time went, read from pytest's JUnit report: the wall time, the summed test
time by layer, by xdist group (a group runs on one worker, so its sum is a floor of the wall
time) and by module, and the slowest tests.

``python -m tests.support.durations reports/junit.xml [--top N] [--before EARLIER.xml]``: with
``--before``, the wall time, each layer and each xdist group of both runs side by side."""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

UNGROUPED = "(any worker)"
GROUP = re.compile(r"@([\w-]+)$")


@dataclass(frozen=True)
class Case:
    """One test's phases (setup, call, teardown) summed, as the report gives them."""

    module: str
    name: str
    seconds: float

    @property
    def layer(self) -> str:
        parts = self.module.split(".")
        return parts[1] if len(parts) > 2 else self.module

    @property
    def group(self) -> str:
        """The xdist group, which pytest-xdist appends to the test's name (after any
        parameters) as ``@group``."""
        found = GROUP.search(self.name)
        return found.group(1) if found else UNGROUPED


def read(report: Path) -> tuple[float, list[Case]]:
    """The suite's wall time and its test cases."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"{report}: no <testsuite> in this file; is it pytest's --junitxml?")
    cases = [Case(str(c.get("classname")), str(c.get("name")), float(c.get("time") or 0))
             for c in suite.iter("testcase")]
    return float(suite.get("time") or 0), cases


def totals(cases: list[Case], key: str) -> list[tuple[str, int, float]]:
    """(name, tests, seconds) per value of ``key``, the largest sum first."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for case in cases:
        name = getattr(case, key)
        seconds[name] += case.seconds
        count[name] += 1
    return sorted(((n, count[n], s) for n, s in seconds.items()), key=lambda t: -t[2])


def render(wall: float, cases: list[Case], top: int) -> str:
    lines = [f"{len(cases)} tests, {sum(c.seconds for c in cases):.0f} s of test time "
             f"in {wall:.0f} s of wall time"]
    for title, key, limit in (("layer", "layer", None), ("xdist group", "group", None),
                              ("module", "module", top)):
        lines.append(f"by {title}:")
        lines += [f"  {s:8.1f} s {n:5} tests  {name}" for name, n, s in totals(cases, key)[:limit]]
    lines.append(f"slowest {top} tests:")
    lines += [f"  {c.seconds:8.1f} s  {c.module}::{c.name}"
              for c in sorted(cases, key=lambda c: -c.seconds)[:top]]
    return "\n".join(lines)


def compare(before: tuple[float, list[Case]], after: tuple[float, list[Case]]) -> str:
    """Both runs' wall time, test count, and summed test time by layer and by xdist group."""
    (wall_0, cases_0), (wall_1, cases_1) = before, after

    def row(name: str, tests: tuple[int, int], seconds: tuple[float, float]) -> str:
        ratio = f"{seconds[1] / seconds[0]:.2f}" if seconds[0] else "-"
        return (f"  {name:<22} {tests[0]:>5} -> {tests[1]:<5} tests  "
                f"{seconds[0]:8.1f} s -> {seconds[1]:8.1f} s  x{ratio}")

    lines = ["before -> after:",
             row("wall time", (len(cases_0), len(cases_1)), (wall_0, wall_1))]
    for title, key in (("layer", "layer"), ("xdist group", "group")):
        lines.append(f"by {title}:")
        was = {name: (n, s) for name, n, s in totals(cases_0, key)}
        now = {name: (n, s) for name, n, s in totals(cases_1, key)}
        for name in sorted(was.keys() | now.keys(), key=lambda k: -now.get(k, (0, 0.0))[1]):
            (n0, s0), (n1, s1) = was.get(name, (0, 0.0)), now.get(name, (0, 0.0))
            lines.append(row(name, (n0, n1), (s0, s1)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--before", type=Path, help="an earlier run's report, to compare with")
    args = parser.parse_args()
    for report in (args.report, args.before):
        if report is not None and not report.is_file():
            raise SystemExit(f"{report}: no such report; run pytest with --junitxml={report}")
    after = read(args.report)
    print(render(*after, args.top))
    if args.before is not None:
        print(compare(read(args.before), after))


if __name__ == "__main__":
    main()
