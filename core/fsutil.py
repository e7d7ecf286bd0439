"""Small POSIX helpers shared by connectors that stage files."""

from __future__ import annotations

import os

from .errors import ConfigurationError


def fsync_path(path: str) -> None:
    """Make a file's data, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def require_writable_dir(directory: str, what: str, fix: str) -> None:
    """Create ``directory`` if needed and prove a file can be written there.

    Raises ``ConfigurationError`` naming ``what`` (e.g. "output directory /data/out")
    and ``fix``, before anything of a batch is written.
    """
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigurationError(
            f"{what} is not writable ({exc.strerror})",
            fix=f"{fix}; nothing of this batch was written",
        ) from None
