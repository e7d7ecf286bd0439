"""Delta Lake tables as exactly-once participants (issue 51): ``DeltaSink``."""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .sink import DeltaSink

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {"DeltaSink": ".sink"})

__all__ = ["DeltaSink"]
