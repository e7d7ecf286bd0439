"""A local S3-compatible server for the tests: moto's S3 (PyPI; what s3fs and pandas
test against) behind a lock that makes its conditional writes atomic.

    python -m sparkeos.testing.s3server --port 29900 [--no-conditional-writes]

Why the lock: moto's handler of a ``PUT`` with ``If-None-Match: *`` looks the key up,
then stores the object, and its server answers each request on a thread of its own.
Two writers racing for one key could both pass the look-up. Here every request that
changes the store (``PUT``, ``POST``, ``DELETE``) runs alone, so the look-up and the
write are one step, as on S3 itself; reads run side by side.

``--no-conditional-writes`` drops the ``If-None-Match`` and ``If-Match`` headers before
moto sees them: a store that ignores conditional writes (S3 before August 2024, some
S3-compatible servers today), for the test that sparkeos refuses one.

Data lives in memory: a restart of the server starts empty.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

WRITES = frozenset({"PUT", "POST", "DELETE"})
CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")


def serialized_writes(app: Callable[..., Iterable[bytes]], conditional: bool = True
                      ) -> Callable[..., Iterable[bytes]]:
    """``app`` with every write answered alone (the body read and the response made
    inside the lock); with ``conditional=False`` the precondition headers dropped."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]
                ) -> Iterable[bytes]:
        if not conditional:
            for header in CONDITIONS:
                environ.pop(header, None)
        if environ.get("REQUEST_METHOD") not in WRITES:
            return app(environ, start_response)
        with lock:
            # Drain the response inside the lock: moto may do its work lazily.
            return [b"".join(app(environ, start_response))]

    return wrapped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-conditional-writes", action="store_true")
    args = parser.parse_args(argv)

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port,
               serialized_writes(app, conditional=not args.no_conditional_writes),
               threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
