"""The module paths that moved (core/moved.py) still import, for one release, with a
warning that names the new path."""

from __future__ import annotations

import importlib
import sys

import pytest

from sparkeos.core.moved import MOVED


def _fresh_import(name: str) -> object:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_with_a_warning_naming_the_new(old: str) -> None:
    home = MOVED[old][0]
    with pytest.warns(DeprecationWarning, match=home.replace(".", r"\.")):
        module = _fresh_import(old)
    new = importlib.import_module(home)
    if len(MOVED[old]) == 1:
        assert module is new  # one module under two names: a patch through either holds
        assert new.__spec__ is not None and new.__spec__.name == home
    else:
        for home in (importlib.import_module(h) for h in MOVED[old]):
            for name in (n for n in vars(home) if not n.startswith("_")):
                assert name in dir(module)
                if home is new or not hasattr(new, name):
                    assert getattr(module, name) is getattr(home, name), name


def test_names_that_left_a_module_are_found_through_its_old_path() -> None:
    from sparkeos.core.config import task_property
    from sparkeos.core.storage.logstores import open_store
    from sparkeos.core.storage.registry import split_uri
    from sparkeos.core.storage.stores.local import LocalFiles
    from sparkeos.core.streaming.tasklease import TaskRenewal

    with pytest.warns(DeprecationWarning):
        commitlog = _fresh_import("sparkeos.core.commitlog")
        files = _fresh_import("sparkeos.core.files")
        spark = _fresh_import("sparkeos.core.spark")
        lease = _fresh_import("sparkeos.core.lease")
    assert commitlog.open_store is open_store  # type: ignore[attr-defined]
    assert files.split_uri is split_uri  # type: ignore[attr-defined]
    assert files.LocalFiles is LocalFiles  # type: ignore[attr-defined]
    assert spark.task_property is task_property  # type: ignore[attr-defined]
    assert lease.TaskRenewal is TaskRenewal  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        commitlog.nothing  # type: ignore[attr-defined]  # noqa: B018


def test_a_patch_through_an_old_path_reaches_the_code_that_uses_the_name() -> None:
    from unittest import mock

    from sparkeos.core.storage import registry

    with pytest.warns(DeprecationWarning):
        _fresh_import("sparkeos.core.files")
    original = registry.split_uri
    with mock.patch("sparkeos.core.files.split_uri", lambda location: ("patched", location)):
        assert registry.split_uri("x") == ("patched", "x")
    assert registry.split_uri is original


def test_the_public_imports_are_where_they_were() -> None:
    from sparkeos import at_least_once, exactly_once
    from sparkeos.core import Coordinator, TransactionalSink
    from sparkeos.core.protocol import Receipt, Transaction
    from sparkeos.testing.conformance import ConnectorConformance, FormatConformance

    assert callable(exactly_once) and callable(at_least_once)
    assert Coordinator.__module__ == "sparkeos.core.snapshot.coordinator"
    assert TransactionalSink.__module__ == "sparkeos.core.protocol"
    assert Receipt is not None and Transaction is not None
    assert isinstance(FormatConformance, type) and isinstance(ConnectorConformance, type)
