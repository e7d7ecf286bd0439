"""Files an attempt writes into a table's own directory before any commit references
them: the attempt's manifest and the write into place, on a local or mounted path (the
functions) or on any store of ``core.storage.stores`` (``TableFiles``).

A table sink (Delta, Iceberg) writes its data files where the table keeps them, so its
commit only has to reference them. Each attempt first claims its manifest,
``<root>/_sparkeos/attempts/<txn id>.json`` (``{"files": [...]}``), exclusively: a second
attempt of the same transaction ID finds it and is fenced. The manifest names each file
before the file is written (durable first), so a rollback finds every file without
listing the table. A file is written under a temporary name, fsynced, and linked to its
name, which never replaces a file: a zombie of a committed attempt cannot overwrite
what a commit references. Table readers skip ``_sparkeos/`` (a name starting with ``_``).

On an object store or HDFS (``TableFiles`` over a ``Files``) the same rules hold by the
store's own write-once create: the claim is a create of the manifest that fails if it
exists, a data file is uploaded from the task's disk by a create that fails if the name
exists (``Files.upload_new``: a zombie is fenced, never replaces a committed file), and
the manifest is replaced whole (one ``PUT``).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import posixpath
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .files import Files

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


def write_new(target: str, write: Callable[[str], None]) -> int | None:
    """``write(temporary)``, then link it to ``target`` (``link_new``): its size, or None
    if ``target`` exists."""
    temporary = temporary_for(target)
    write(temporary)
    return link_new(temporary, target)


def delete_written(paths: Sequence[str]) -> None:
    """Delete files and any temporary name a dead writer left beside them."""
    for target in paths:
        for path in [target, *glob.glob(glob.escape(target) + ".*.tmp")]:
            try:
                os.remove(path)
            except OSError as exc:
                # A name too long for the file system was never written either.
                if exc.errno not in (errno.ENOENT, errno.ENAMETOOLONG):
                    raise


@dataclass(frozen=True)
class TableFiles:
    """A table's directory on its store (``core.storage.registry.split_uri``), for the
    files of attempts: ``root`` is the path inside ``files``; every other path is
    relative to it, ``/``-separated. On a local path each call is the function of this
    module of the same name."""

    files: Files
    root: str

    @property
    def is_local(self) -> bool:
        return self.files.is_local

    def path(self, relative: str) -> str:
        if self.is_local:
            return os.path.join(self.root, relative)
        return posixpath.join(self.root, relative)

    def uri(self, relative: str = "") -> str:
        """What a table library is given (``s3a://bucket/table/...``; a local path as it is)."""
        path = self.path(relative) if relative else self.root
        return path if self.is_local else self.files.uri(path)

    def check_writes(self) -> None:
        """Refuse an object store whose create-if-absent does not hold (the claims and
        the writes that never replace rest on it), by a probe beside the manifests;
        nothing for a local path or HDFS."""
        from .stores.writeonce import ObjectStoreFiles

        if isinstance(self.files, ObjectStoreFiles):
            self.files.check_conditional_writes(self.path(f"{SPARKEOS_DIR}/probe"))

    def claim(self, txn_id: str) -> bool:
        if self.is_local:
            return claim(self.root, txn_id)
        try:
            self.files.create_new(manifest_path(self.root, txn_id), _manifest_body([]))
        except FileExistsError:
            return False
        return True

    def write_manifest(self, txn_id: str, names: Sequence[str]) -> None:
        if self.is_local:
            write_manifest(self.root, txn_id, names)
        else:
            self.files.overwrite(manifest_path(self.root, txn_id), _manifest_body(names))

    def read_manifest(self, txn_id: str) -> list[str] | None:
        if self.is_local:
            return read_manifest(self.root, txn_id)
        try:
            data = self.files.read(manifest_path(self.root, txn_id))
        except FileNotFoundError:
            return None
        return [str(p) for p in json.loads(data)["files"]]

    def manifests(self) -> set[str]:
        if self.is_local:
            return manifests(self.root)
        names = self.files.listdir(attempts_dir(self.root))
        return {name[: -len(".json")] for name in names if name.endswith(".json")}

    def delete_manifest(self, txn_id: str) -> None:
        if self.is_local:
            delete_manifest(self.root, txn_id)
        else:
            self.files.delete(manifest_path(self.root, txn_id))

    def write_new(self, relative: str, write: Callable[[str], None]) -> int | None:
        """``write(local file)``, then put it at ``relative``, never over a file there:
        its size, or None if the name exists (a zombie of the attempt's ID)."""
        if self.is_local:
            return write_new(self.path(relative), write)
        descriptor, temporary = tempfile.mkstemp(prefix="sparkeos-table-", suffix=".tmp")
        os.close(descriptor)
        try:
            write(temporary)
            size = os.path.getsize(temporary)
            try:
                self.files.upload_new(temporary, self.path(relative))
            except FileExistsError:
                return None
            return size
        finally:
            os.remove(temporary)

    def exists(self, relative: str) -> bool:
        return self.files.exists(self.path(relative))

    def read(self, relative: str) -> bytes:
        return self.files.read(self.path(relative))

    def delete(self, relatives: Sequence[str]) -> None:
        if self.is_local:
            delete_written([self.path(r) for r in relatives])
        else:
            for relative in relatives:
                self.files.delete(self.path(relative))



def _manifest_body(names: Sequence[str]) -> bytes:
    return json.dumps({"files": list(names)}).encode()
