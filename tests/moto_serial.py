"""moto's DynamoDB with one request handled at a time: ``python tests/moto_serial.py PORT``.

moto's own server mode runs each request on a thread of its own, and its
DynamoDB backend checks a write's condition and applies the write as separate
steps without a lock, so two concurrent conditional writes to one item can
both succeed (plain ``UpdateItem ... attribute_not_exists(pk)`` from 50 threads
gets two winners now and then). Real DynamoDB applies each item write
atomically, which is what the store's race test relies on.

Here one thread runs an asyncio loop that reads requests from every
connection and hands each, whole, to moto's DynamoDB app, which answers it
before the loop reads on: requests never interleave, so every write is atomic.
That also spares what a thread per connection costs (moto is pure Python and
holds the GIL anyway): a third less server CPU per request than werkzeug's
threaded server with a lock around the app. It serves DynamoDB only, which
spares moto's search for the service of each request too.

The listen queue is deep: the race test opens about 500 connections at once,
and with a short queue some of them wait for a SYN retransmission past the
store's 2 s connect timeout.
"""

from __future__ import annotations

import asyncio
import io
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import create_backend_app

BACKLOG = 1024
HEAD_LIMIT = 64 * 1024  # request line and headers; bodies are read by their length

Headers = list[tuple[str, str]]
App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def answer(app: App, port: int, method: str, target: str, headers: Headers, body: bytes) -> bytes:
    """The whole HTTP response of ``app`` to one request."""
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ[key] = value
        elif key != "CONTENT_LENGTH":
            environ[f"HTTP_{key}"] = value
    started: list[Any] = []

    def start_response(status: str, response_headers: Headers, exc_info: Any = None) -> Any:
        started[:] = [status, response_headers]
        return lambda data: None

    try:
        chunks = app(environ, start_response)
        try:
            payload = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        status, response_headers = started
    except Exception:  # moto's own bug: the client sees a server error, the log the trace
        traceback.print_exc()
        status, response_headers, payload = "500 Internal Server Error", [], b""
    lines = [f"HTTP/1.1 {status}\r\n"]
    lines += [f"{k}: {v}\r\n" for k, v in response_headers if k.lower() != "content-length"]
    lines.append(f"Content-Length: {len(payload)}\r\n\r\n")
    return "".join(lines).encode("latin-1") + payload


async def serve(port: int) -> None:
    app: App = create_backend_app("dynamodb")

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: requests of one connection, one after the other
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *header_lines = head.split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers = [
                    (name.strip(), value.strip())
                    for name, _, value in (line.partition(":") for line in header_lines if line)
                ]
                length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
                body = await reader.readexactly(length) if length else b""
                # answer() never yields to the loop: no other request runs meanwhile.
                writer.write(answer(app, port, method, target, headers, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client closed, or cut, the connection
        except ValueError:
            traceback.print_exc()  # not HTTP: drop the connection, keep serving
        finally:
            writer.close()

    server = await asyncio.start_server(
        connection, "127.0.0.1", port, backlog=BACKLOG, limit=HEAD_LIMIT
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
