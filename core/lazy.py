"""Package attributes imported on first use.

Spark imports every installed ``pyspark_sparkeos_*`` module in a fresh Python process of
its own (its lookup of data sources, at each session's first format; the creation of a
format's data source, at each query's first batch). Those processes need the format's
class and nothing else, so the packages on that path (``sparkeos``, ``sparkeos.core``,
the connectors) export their names lazily: ``from sparkeos.core import Coordinator``
imports ``sparkeos.core.snapshot.coordinator`` then, not before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to the module
    (relative to the package, e.g. ``".sink"``) that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
