"""Delta Lake tables as exactly-once participants (issue 51): ``DeltaSink``."""

from .sink import DeltaSink

__all__ = ["DeltaSink"]
