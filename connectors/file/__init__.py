"""Exactly-once file sink (JSON Lines, Parquet) for local and shared POSIX directories."""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .sink import FileSink, committed_files, read_output

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {
    "FileSink": ".sink",
    "committed_files": ".sink",
    "read_output": ".sink",
})

__all__ = ["FileSink", "committed_files", "read_output"]
