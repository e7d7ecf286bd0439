"""Files an attempt writes into a table's own directory before any commit references
them, on a local or mounted path: the attempt's manifest and the link into place.

A table sink (Delta, Iceberg) writes its data files where the table keeps them, so its
commit only has to reference them. Each attempt first claims its manifest,
``<root>/_sparkeos/attempts/<txn id>.json`` (``{"files": [...]}``), exclusively: a second
attempt of the same transaction ID finds it and is fenced. The manifest names each file
before the file is written (durable first), so a rollback finds every file without
listing the table. A file is written under a temporary name, fsynced, and linked to its
name, which never replaces a file: a zombie of a committed attempt cannot overwrite
what a commit references. Table readers skip ``_sparkeos/`` (a name starting with ``_``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

SPARKEOS_DIR = "_sparkeos"


def attempts_dir(root: str) -> str:
    return os.path.join(root, SPARKEOS_DIR, "attempts")


def manifest_path(root: str, txn_id: str) -> str:
    return os.path.join(attempts_dir(root), f"{txn_id}.json")


def claim(root: str, txn_id: str) -> bool:
    """Create the attempt's manifest if no attempt of this ID has one (exclusive:
    two attempts of one ID at once, one wins)."""
    target = manifest_path(root, txn_id)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump({"files": []}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def write_manifest(root: str, txn_id: str, names: Sequence[str]) -> None:
    """Replace the attempt's manifest (durable before the file it names is written)."""
    target = manifest_path(root, txn_id)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temporary = f"{target}.tmp"
    with open(temporary, "w") as fh:
        json.dump({"files": list(names)}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, target)


def read_manifest(root: str, txn_id: str) -> list[str] | None:
    """The files the attempt's manifest names; None if it has none."""
    try:
        with open(manifest_path(root, txn_id)) as fh:
            return [str(p) for p in json.load(fh)["files"]]
    except FileNotFoundError:
        return None


def manifests(root: str) -> set[str]:
    """The transaction IDs that have a manifest (one listing of the directory)."""
    try:
        names = os.listdir(attempts_dir(root))
    except FileNotFoundError:
        return set()
    return {name[: -len(".json")] for name in names if name.endswith(".json")}


def delete_manifest(root: str, txn_id: str) -> None:
    for path in (manifest_path(root, txn_id), f"{manifest_path(root, txn_id)}.tmp"):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def temporary_for(target: str) -> str:
    """Where a file is written before ``link_new`` puts it at ``target`` (per process:
    two attempts of one ID never share it)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    return f"{target}.{os.getpid()}.tmp"


def link_new(temporary: str, target: str) -> int | None:
    """fsync ``temporary`` and link it to ``target``, which never replaces a file; the
    temporary name is removed either way. The file's size, or None if ``target`` exists
    (a file of the same attempt ID is there already, perhaps committed: this attempt is
    a zombie)."""
    try:
        with open(temporary, "rb") as fh:
            os.fsync(fh.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            return None
        return os.path.getsize(target)
    finally:
        os.remove(temporary)


def delete_written(paths: Sequence[str]) -> None:
    """Delete files and any temporary name a dead writer left beside them."""
    for target in paths:
        for path in [target, *glob.glob(glob.escape(target) + ".*.tmp")]:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
