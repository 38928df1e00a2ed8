"""moto's server mode, answering one request at a time: ``python -m tests.chaos.moto_serial PORT``.

moto's threaded server checks a condition expression and writes the item in
separate steps without a lock, so two concurrent conditional UpdateItems on
one key can both succeed (seen here: about 1 key in 30 with 8 racing
writers). DynamoDB itself never lets that happen, and a chaos run must not
blame semel for a double claim its test server granted. A lock around the
application makes every request atomic, as on AWS.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialised(app: Wsgi) -> Wsgi:
    lock = threading.Lock()

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    return wsgi


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        port,
        serialised(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
