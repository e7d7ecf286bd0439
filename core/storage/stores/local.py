"""POSIX paths as a ``Files``: ``O_EXCL`` creates, ``mkdir`` claims, ``link`` publishes."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass

from sparkeos.core.storage.files import Files


@dataclass(frozen=True)
class LocalFiles(Files):
    """POSIX paths (a local disk, or a shared mount such as NFS)."""

    def uri(self, path: str) -> str:
        return path

    @property
    def is_local(self) -> bool:
        return True

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def claim_dir(self, path: str) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path)  # never succeeds twice
        except FileExistsError:
            return False
        return True

    def create_new(self, path: str, data: bytes) -> None:
        with open(path, "xb") as fh:
            fh.write(data)

    def upload_new(self, local_file: str, path: str) -> None:
        with open(local_file, "rb") as src, open(path, "xb") as dst:
            shutil.copyfileobj(src, dst)

    def publish(self, staged: str, final: str) -> None:
        # rename() replaces silently, link() does not.
        os.link(staged, final)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read(self, path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    def delete(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def make_durable(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["LocalFiles"]
