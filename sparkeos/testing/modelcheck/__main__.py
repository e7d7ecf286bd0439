"""``python -m sparkeos.testing.modelcheck [--bound small|full|realtime-small|realtime-full]
[--mutant NAME]`` (the ``realtime-`` bounds check real-time mode's per-partition
protocol: ``realtime``)."""

from __future__ import annotations

import argparse
import sys

from . import realtime
from .explore import BOUNDS, Report, explore
from .mutants import MUTANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelcheck", description=__doc__)
    parser.add_argument("--bound", choices=sorted({*BOUNDS, *realtime.BOUNDS}),
                        default="full")
    parser.add_argument("--mutant", choices=sorted({*MUTANTS, *realtime.MUTANTS}),
                        help="put one fixed bug back; the check must then fail")
    parser.add_argument("--stop-on-first", action="store_true")
    args = parser.parse_args(argv)
    if args.bound in realtime.BOUNDS:
        return _realtime(args.bound, args.mutant, args.stop_on_first, parser)
    if args.mutant is not None and args.mutant not in MUTANTS:
        parser.error(f"mutant {args.mutant} belongs to the real-time bounds (--bound "
                     "realtime-small or realtime-full)")

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


def _realtime(bound: str, mutant: str | None, stop_on_first: bool,
              parser: argparse.ArgumentParser) -> int:
    if mutant is not None and mutant not in realtime.MUTANTS:
        parser.error(f"mutant {mutant} belongs to the other bounds; real-time mode's: "
                     + ", ".join(sorted(realtime.MUTANTS)))
    print(f"real-time model check, bound {bound}"
          + (f"; mutant {mutant}" if mutant else ""), flush=True)
    report = realtime.explore(realtime.BOUNDS[bound], mutant, stop_on_first)
    if report.failures:
        scenario, violations, trace = min(report.failures, key=lambda f: len(f[2]))
        print(f"shortest failing schedule ({scenario}, {len(trace)} steps):")
        for line in trace:
            print(f"    {line}")
        for violation in violations:
            print(f"  VIOLATION: {violation}")
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
