"""The one-row answers of phase-1 tasks (``core.streaming.spark._one_row``)."""

from __future__ import annotations

import subprocess
import sys

from sparkeos.core.streaming.spark import _TASK_ITEM, _TASK_RESULT, _one_row


def test_a_task_result_and_an_item_read_back_as_written() -> None:
    result = _one_row(_TASK_RESULT, 3, '{"staged": "é"}'.encode())
    result.validate(full=True)
    assert result.schema == _TASK_RESULT
    assert result.to_pylist() == [{"partition": 3, "result": '{"staged": "é"}'}]
    item = _one_row(_TASK_ITEM, 2**40, b"\x00\xff")
    item.validate(full=True)
    assert item.to_pylist() == [{"index": 2**40, "result": b"\x00\xff"}]
    assert _one_row(_TASK_ITEM, 0, b"").to_pylist() == [{"index": 0, "result": b""}]


def test_building_one_does_not_import_pandas() -> None:
    """A fresh Python worker that only stages and answers never pays pandas' import
    (0.5 s of a core): ``pa.array`` / ``from_pylist`` would import it."""
    probe = ("import sys; from sparkeos.core.streaming.spark import _TASK_RESULT, _one_row; "
             "_one_row(_TASK_RESULT, 1, b'{}'); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stderr
