"""``python -m sparkeos.testing.modelcheck [--bound small|full] [--mutant NAME]``."""

from __future__ import annotations

import argparse
import sys

from .explore import BOUNDS, Report, explore
from .mutants import MUTANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelcheck", description=__doc__)
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="full")
    parser.add_argument("--mutant", choices=sorted(MUTANTS),
                        help="put one fixed bug back; the check must then fail")
    parser.add_argument("--stop-on-first", action="store_true")
    args = parser.parse_args(argv)

    def progress(report: Report) -> None:
        print(f"  ... {report.schedules} schedules, {len(report.states)} states, "
              f"{report.violations} violations, {report.seconds:.0f} s", flush=True)

    bound = BOUNDS[args.bound]
    print(f"model check, bound {bound.name}: "
          + ", ".join(s.name for s in bound.scenarios)
          + (f"; mutant {args.mutant}" if args.mutant else ""), flush=True)
    report = explore(bound, args.mutant, args.stop_on_first, progress)
    for scenario, count in report.by_scenario.items():
        print(f"  {scenario}: {count} schedules")
    print(f"  {report.steps} steps in {report.seconds:.1f} s")
    shortest = report.shortest
    if shortest is not None:
        print(f"shortest failing schedule ({shortest.scenario}, {len(shortest.trace)} steps):")
        for line in shortest.trace:
            print(f"    {line}")
        for violation in shortest.violations:
            print(f"  VIOLATION: {violation}")
    print(report.summary())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
