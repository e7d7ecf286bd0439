"""Print, at the end of a CI run, where its time went: one row per stage (wall time and
test counts, from the stage's JUnit XML) and the 15 slowest tests of the run.

    python3 .ci/report.py [--wall SECONDS] STAGE=SECONDS:JUNIT.xml [...]

``--wall``: the run's own wall time (stages that ran side by side overlap); without it,
the stages' sum.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def stage_figures(path: str) -> tuple[dict[str, int], list[tuple[float, str]]]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    cases: list[tuple[float, str]] = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts, cases
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time", 0) or 0), name))
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, cases


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv: list[str]) -> int:
    rows, slowest, total = [], [], 0.0
    wall = None
    if argv[:1] == ["--wall"]:
        wall, argv = float(argv[1]), argv[2:]
    for arg in argv:
        stage, _, rest = arg.partition("=")
        seconds, _, path = rest.partition(":")
        counts, cases = stage_figures(path)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
