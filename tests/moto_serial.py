"""moto's DynamoDB server with one request handled at a time: ``python tests/moto_serial.py PORT``.

moto's own server mode runs each request on a thread of its own, and its
DynamoDB backend checks a write's condition and applies the write as separate
steps without a lock, so two concurrent conditional writes to one item can
both succeed (plain ``UpdateItem ... attribute_not_exists(pk)`` from 50 threads
gets two winners now and then). Real DynamoDB applies each item write
atomically, which is what the store's race test relies on; a lock around the
application restores that (tests/chaos/moto_serial.py does the same for the
chaos run).

The listen queue is deeper than werkzeug's 128: the race test opens about 500
connections at once, and with the default queue some of them wait for a SYN
retransmission past the store's 2 s connect timeout.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import ThreadedWSGIServer


class Server(ThreadedWSGIServer):
    request_queue_size = 1024


def main(port: int) -> None:
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serially(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    Server("127.0.0.1", port, serially, handler=MotoRequestHandler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
