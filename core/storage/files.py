"""File systems a Python process (driver or task) can stage and publish files on.

Exactly-once file output needs three things of a file system, and nothing else:

* **write-once creation**: creating a file that exists fails (a zombie attempt can
  never replace a committed file);
* **exclusive claim**: of two attempts claiming the same staging directory, one fails;
* **publish without overwrite**: moving a staged file to its final name fails if the
  name exists, atomically (readers see the whole file or none).

``Files`` is that contract; each file system keeping it is a module of
``core.storage.stores``: POSIX (``O_EXCL``, ``mkdir``, ``link``), HDFS through WebHDFS
(``CREATE`` with ``overwrite=false``, ``RENAME``), and the object stores S3, Google
Cloud Storage and Azure Blob Storage through their conditional creates (one write-once
layer for the three, ``core.storage.stores.writeonce``). Other object stores (``oss://``) are
refused: through Hadoop their copy-based "rename" overwrites, so a zombie could replace
a committed part (see docs/connectors/file.md). ``split_uri`` picks the store of a
location, parsed as Hadoop parses it (``core.storage.locations``).

Paths given to a ``Files`` are absolute paths inside that file system (``/data/out``);
``uri(path)`` gives the full URI for messages.
"""

from __future__ import annotations

import posixpath
import uuid
from abc import ABC, abstractmethod

OBJECT_STORES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "r2")
"""Schemes of object stores: no atomic rename, no create-if-absent through Hadoop."""
S3_SCHEMES = ("s3", "s3a", "s3n")
GCS_SCHEMES = ("gs",)
AZURE_SCHEMES = ("abfs", "abfss", "wasb", "wasbs")
WRITE_ONCE_STORES = S3_SCHEMES + GCS_SCHEMES + AZURE_SCHEMES
"""The object stores sparkeos writes itself, by their conditional creates
(``core.storage.stores``)."""


class Files(ABC):
    """One file system. Every method takes absolute paths inside it."""

    @abstractmethod
    def uri(self, path: str) -> str: ...

    @property
    def is_local(self) -> bool:
        return False

    @property
    def atomic_create(self) -> bool:
        """``create_new`` makes the file visible whole or not at all (an object store's
        ``PUT``): a write-once record needs no temporary name then."""
        return False

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def claim_dir(self, path: str) -> bool:
        """Create ``path`` for this caller only: False if it exists (another claimed it)."""

    @abstractmethod
    def create_new(self, path: str, data: bytes) -> None:
        """Write ``path`` whole; ``FileExistsError`` if it exists."""

    @abstractmethod
    def upload_new(self, local_file: str, path: str) -> None:
        """Copy a local file to ``path``; ``FileExistsError`` if it exists."""

    @abstractmethod
    def publish(self, staged: str, final: str) -> None:
        """Give ``staged`` the name ``final``, atomically and never over an existing file:
        ``FileExistsError`` if ``final`` exists, ``FileNotFoundError`` if ``staged`` does not.
        ``staged`` may be gone afterwards (moved) or kept (linked)."""

    @abstractmethod
    def replace(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, replacing ``dst`` if present."""

    def write_temporary(self, directory: str, data: bytes) -> str:
        """Write ``data`` whole to a new hidden file in ``directory`` (made if needed);
        its path."""
        self.makedirs(directory)
        temporary = posixpath.join(directory, f".tmp-{uuid.uuid4().hex}")
        self.create_new(temporary, data)
        return temporary

    def overwrite(self, path: str, data: bytes) -> None:
        """Write ``path`` whole, replacing what it holds: a reader sees the old data or
        the new, never a part (a temporary file beside it, then ``replace``)."""
        self.replace(self.write_temporary(posixpath.dirname(path), data), path)

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in ``path``; ``[]`` if it does not exist."""

    @abstractmethod
    def read(self, path: str) -> bytes: ...

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file or a whole directory; nothing if it does not exist."""

    def make_durable(self, path: str) -> None:  # noqa: B027 - most stores need nothing
        """Make ``path``'s data (or a directory's entries) survive a crash of this host."""


__all__ = ["AZURE_SCHEMES", "GCS_SCHEMES", "OBJECT_STORES", "S3_SCHEMES", "WRITE_ONCE_STORES",
           "Files"]
