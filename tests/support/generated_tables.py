"""Generated Arrow tables for the table formats' comparisons with their own libraries'
writers (hypothesis): an ``id`` column and a column of each drawn kind, nulls among the
values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa


def draw_table(draw: Any, kinds: Sequence[str], values: Mapping[str, tuple[pa.DataType, Any]],
               count: int) -> pa.Table:
    """``count`` rows: ``id`` 0.. and a column ``c<kind>`` of each of ``kinds``, drawn
    from ``values[kind]`` (its Arrow type, a strategy of its values) or null."""
    from hypothesis import strategies as st

    columns: dict[str, pa.Array] = {"id": pa.array(range(count), pa.int64())}
    for kind in kinds:
        kind_type, strategy = values[kind]
        columns[f"c{kind}"] = pa.array(
            draw(st.lists(st.one_of(st.none(), strategy), min_size=count, max_size=count)),
            kind_type)
    return pa.table(columns)


__all__ = ["draw_table"]
