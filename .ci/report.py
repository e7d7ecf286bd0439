"""Print, at the end of a CI run, where its time went: one row per stage (wall time and
test counts, from the stage's JUnit XML), the 15 slowest tests of the run and, last, each
failed test with the first line of its message.

    python3 .ci/report.py [--wall SECONDS] STAGE=SECONDS:JUNIT.xml [...]

``--wall``: the run's own wall time (stages that ran side by side overlap); without it,
the stages' sum.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def stage_figures(
    path: str,
) -> tuple[dict[str, int], list[tuple[float, str]], list[tuple[str, str]]]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    cases: list[tuple[float, str]] = []
    failures: list[tuple[str, str]] = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts, cases, failures
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time", 0) or 0), name))
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            counts["failed"] += 1
            failures.append((name, (problem.get("message") or "").strip()))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, cases, failures


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv: list[str]) -> int:
    rows, slowest, failures, total = [], [], [], 0.0
    wall = None
    if argv[:1] == ["--wall"]:
        wall, argv = float(argv[1]), argv[2:]
    for arg in argv:
        stage, _, rest = arg.partition("=")
        seconds, _, path = rest.partition(":")
        counts, cases, failed = stage_figures(path)
        failures += [(stage, name, message) for name, message in failed]
        total += float(seconds)
        rows.append((stage, float(seconds), counts))
        slowest += [(t, stage, name) for t, name in cases]
    print("\n== CI time ==")
    print(f"{'stage':<18} {'wall':>8} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for stage, seconds, counts in rows:
        print(f"{stage:<18} {minutes(seconds):>8} {counts['passed']:>7} "
              f"{counts['failed']:>7} {counts['skipped']:>8}")
    print(f"{'total':<18} {minutes(total if wall is None else wall):>8}")
    print("\n15 slowest tests (setup + call + teardown):")
    for seconds, stage, name in sorted(slowest, reverse=True)[:15]:
        print(f"  {seconds:7.1f}s  {stage:<12} {name}")
    # Last, so that a reader who sees only the end of the log still sees what failed.
    if failures:
        print(f"\n{len(failures)} failed:")
        for stage, name, message in failures:
            print(f"  {stage:<12} {name}")
            print(f"      {message.splitlines()[0][:300] if message else '(no message)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
