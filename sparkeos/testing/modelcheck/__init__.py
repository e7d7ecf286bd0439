"""An exhaustive model check of the exactly-once protocol (``./run modelcheck``).

It drives the real ``Coordinator`` and ``CommitLog`` through every schedule of a model
of Spark, within a bound: driver crashes at every step, task attempts that fail, run
concurrently (speculation, retried stages) or late (zombies), ``sparkeos recover``
racing the driver, restarts with another partition count. See ``scenario`` for the
invariants it checks and ``mutants`` for the bugs it must find.
"""

from .explore import BOUNDS, FULL, SMALL, Bound, Report, explore
from .mutants import MUTANTS

__all__ = ["BOUNDS", "FULL", "MUTANTS", "SMALL", "Bound", "Report", "explore"]
