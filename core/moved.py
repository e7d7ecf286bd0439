"""The module paths that moved when ``core`` became rooms (docs/architecture.md) and the
conformance suite a package.

Each old path still imports, with a ``DeprecationWarning`` naming the new one, for one
release (CHANGELOG.md). A module that moved whole is the same module object under both names,
so an attribute set through either is seen through both. A module whose names went to
two homes (``commitlog``'s stores, ``files``' registry, ``spark``'s ``task_property``,
``lease``'s ``TaskRenewal``) is a stand-in that finds each name in its homes, in order.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

MOVED: dict[str, tuple[str, ...]] = {
    "sparkeos.core.adapter": ("sparkeos.core.streaming.adapter",),
    "sparkeos.core.batch": ("sparkeos.core.snapshot.batch",),
    "sparkeos.core.checks": ("sparkeos.core.snapshot.checks",),
    "sparkeos.core.commitlog": (
        "sparkeos.core.snapshot.commitlog",
        "sparkeos.core.storage.logstores",
    ),
    "sparkeos.core.coordinator": ("sparkeos.core.snapshot.coordinator",),
    "sparkeos.core.ending": ("sparkeos.core.streaming.ending",),
    "sparkeos.core.files": (
        "sparkeos.core.storage.files",
        "sparkeos.core.storage.registry",
        "sparkeos.core.storage.stores.local",
        "sparkeos.core.storage.stores.webhdfs",
    ),
    "sparkeos.core.fingerprint": ("sparkeos.core.snapshot.fingerprint",),
    "sparkeos.core.formatbatch": ("sparkeos.core.streaming.formatbatch",),
    "sparkeos.core.fsutil": ("sparkeos.core.storage.fsutil",),
    "sparkeos.core.group": ("sparkeos.core.snapshot.group",),
    "sparkeos.core.identity": ("sparkeos.core.streaming.identity",),
    "sparkeos.core.lease": ("sparkeos.core.snapshot.lease", "sparkeos.core.streaming.tasklease"),
    "sparkeos.core.locations": ("sparkeos.core.storage.locations",),
    "sparkeos.core.onstart": ("sparkeos.core.streaming.onstart",),
    "sparkeos.core.overlap": ("sparkeos.core.snapshot.overlap",),
    "sparkeos.core.queryrun": ("sparkeos.core.streaming.queryrun",),
    "sparkeos.core.records": ("sparkeos.core.text.records",),
    "sparkeos.core.recovery": ("sparkeos.core.snapshot.recovery",),
    "sparkeos.core.replay": ("sparkeos.core.snapshot.replay",),
    "sparkeos.core.scope": ("sparkeos.core.snapshot.scope",),
    "sparkeos.core.spark": ("sparkeos.core.streaming.spark", "sparkeos.core.config"),
    "sparkeos.core.sparkjson": ("sparkeos.core.text.sparkjson",),
    "sparkeos.core.sparktext": ("sparkeos.core.text.sparktext",),
    "sparkeos.core.sparkversion": ("sparkeos.core.streaming.sparkversion",),
    "sparkeos.core.sparkzones": ("sparkeos.core.text.sparkzones",),
    "sparkeos.core.staging": ("sparkeos.core.storage.staging",),
    "sparkeos.core.stores": ("sparkeos.core.storage.stores",),
    "sparkeos.core.stores.azure": ("sparkeos.core.storage.stores.azure",),
    "sparkeos.core.stores.gcs": ("sparkeos.core.storage.stores.gcs",),
    "sparkeos.core.stores.local": ("sparkeos.core.storage.stores.local",),
    "sparkeos.core.stores.s3": ("sparkeos.core.storage.stores.s3",),
    "sparkeos.core.stores.settings": ("sparkeos.core.storage.stores.settings",),
    "sparkeos.core.stores.webhdfs": ("sparkeos.core.storage.stores.webhdfs",),
    "sparkeos.core.stores.writeonce": ("sparkeos.core.storage.stores.writeonce",),
    "sparkeos.core.streamformat": ("sparkeos.core.streaming.streamformat",),
    "sparkeos.core.tasks": ("sparkeos.core.snapshot.tasks",),
    "sparkeos.core.txpool": ("sparkeos.core.snapshot.txpool",),
    "sparkeos.testing.races": ("sparkeos.testing.conformance.races",),
    "sparkeos.testing.replays": ("sparkeos.testing.conformance.replays",),
}
"""Old path -> its new home(s): the first is where the module went; the others hold
names that left it."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(MOVED[fullname]),
                                               is_package=fullname.endswith(".stores"))


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, homes: tuple[str, ...]) -> None:
        self.homes = homes
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        warnings.warn(
            f"{spec.name} moved to {self.homes[0]}; import it from there (the old path "
            "is removed in the release after the next, see CHANGELOG.md)",
            DeprecationWarning, stacklevel=2)
        if len(self.homes) == 1:
            module = importlib.import_module(self.homes[0])
            self._own_spec = module.__spec__
            return module
        return _stand_in(spec.name, [importlib.import_module(h) for h in self.homes])

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__spec__ is not None and module.__name__ != module.__spec__.name:
            # Importing gave it the old path's spec: it keeps its own (its relative
            # imports and reloads go by it).
            module.__spec__ = self._own_spec


class _StandIn(types.ModuleType):
    """An old path whose names went to several homes: each name is read from, set on
    and deleted from the home that had it when the stand-in was made (so a patch
    through the old path reaches the code that uses the name, and is undone there)."""

    def __init__(self, name: str, homes: list[types.ModuleType]) -> None:
        super().__init__(name, homes[0].__doc__)
        owners: dict[str, types.ModuleType] = {}
        for home in reversed(homes):  # the first home that has a name owns it
            owners.update((n, home) for n in vars(home) if not n.startswith("__"))
        object.__setattr__(self, "_owners", owners)
        object.__setattr__(self, "_first", homes[0])
        object.__setattr__(self, "__all__", sorted({
            n for home in homes for n in getattr(home, "__all__", [
                n for n in vars(home) if not n.startswith("_")])}))

    def _home(self, attribute: str) -> types.ModuleType:
        owners: dict[str, types.ModuleType] = object.__getattribute__(self, "_owners")
        return owners.get(attribute) or object.__getattribute__(self, "_first")

    def __getattr__(self, attribute: str) -> Any:
        try:
            return getattr(self._home(attribute), attribute)
        except AttributeError:
            raise AttributeError(
                f"module {self.__name__!r} has no attribute {attribute!r}") from None

    def __setattr__(self, attribute: str, value: Any) -> None:
        if attribute.startswith("__"):
            object.__setattr__(self, attribute, value)
        else:
            setattr(self._home(attribute), attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(self._home(attribute), attribute)

    def __dir__(self) -> list[str]:
        owners: dict[str, types.ModuleType] = object.__getattribute__(self, "_owners")
        return sorted(owners)


def _stand_in(name: str, homes: list[types.ModuleType]) -> types.ModuleType:
    return _StandIn(name, homes)


def install() -> None:
    """Serve the old paths (once per interpreter)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
