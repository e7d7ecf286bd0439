"""Locations (paths and URIs) read as Hadoop reads them: one parser for every store.

A checkpoint or output location is written by the user as Spark takes it: a string
Spark hands to Hadoop's ``new Path(String)``. That constructor is not a URI parser:
the scheme is what precedes the first ``:`` when no ``/`` comes before it, the authority
what follows ``//`` up to the next ``/``, and **all the rest is the path, literally**:
``#``, ``?``, spaces and ``%`` are characters of the file or key name, not a fragment,
a query or an escape. ``urllib.parse.urlparse`` would cut ``ckpt#1`` to ``ckpt`` (two
queries sharing one commit log) and write ``out?v=2`` under ``out``.

A running query's checkpoint as Spark reports it (``resolvedCheckpointRoot``) is in the
same form (``file:/tmp/ckpt#1 a%b``: measured on Spark 4.3), and is read the same way.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    scheme: str
    """Lowercased; empty for a plain path."""
    authority: str
    """``host[:port]``, a bucket, a container@account; empty when there is none."""
    path: str
    """The path inside the file system, literally as written (``/`` when empty)."""

    @property
    def is_local(self) -> bool:
        return self.scheme in ("", "file") or (len(self.scheme) == 1 and os.name == "nt")

    @property
    def hostname(self) -> str:
        host = self.authority.rsplit("@", 1)[-1]
        if host.startswith("["):  # an IPv6 literal
            return host[1:host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def port(self) -> int | None:
        host = self.authority.rsplit("@", 1)[-1]
        tail = host.rsplit("]", 1)[-1]
        if ":" not in tail:
            return None
        digits = tail.rsplit(":", 1)[1]
        return int(digits) if digits.isdigit() else None

    def normalized_path(self) -> str:
        return posixpath.normpath(self.path or "/")


def parse(location: str) -> Location:
    """``location`` split as Hadoop's ``new Path(String)`` splits it."""
    scheme, start = "", 0
    colon, slash = location.find(":"), location.find("/")
    if colon != -1 and (slash == -1 or colon < slash):
        scheme, start = location[:colon], colon + 1
    authority = ""
    if location.startswith("//", start) and len(location) - start > 2:
        end = location.find("/", start + 2)
        end = end if end != -1 else len(location)
        authority, start = location[start + 2:end], end
    return Location(scheme.lower(), authority, location[start:])


def local_path(location: str) -> str:
    """The local file system path of a plain path or a ``file:`` location."""
    parsed = parse(location)
    return parsed.path if parsed.scheme == "file" else location


__all__ = ["Location", "local_path", "parse"]
