"""The open of one (partition, epoch) transaction of the real-time writer: the peek, the
fence and the mark read (Kafka: ``init_transactions``, about 80 ms measured). Run ahead
(on a thread of its own while Spark hands the task its first rows, which wait for it),
that time no longer adds to the pause between epochs, which is latency every record of
the next epoch waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Opening(Generic[T]):
    """``call`` run on a thread (``ahead``) or at once (then its error is raised here).
    ``result`` waits for it and returns what it opened, or raises what it raised, each
    time it is asked: a caller that went on after a failure is told again at close."""

    def __init__(self, call: Callable[[], T], ahead: bool) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if not ahead:
            self._value = call()
            return
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True,
                                        name="sparkeos-epoch-open")
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as exc:  # raised in the task's thread by result()
            self._error = exc

    def result(self) -> T:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


__all__ = ["Opening"]
