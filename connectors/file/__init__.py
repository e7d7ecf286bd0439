"""Exactly-once file sink (JSON Lines, Parquet) for local and shared POSIX directories."""

from .sink import FileSink, committed_files, read_output

__all__ = ["FileSink", "committed_files", "read_output"]
