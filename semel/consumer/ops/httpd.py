"""The operations endpoint on ``SEMEL_METRICS_PORT``: ``/metrics``, ``/healthz``, ``/readyz``.

A few lines of asyncio in the consumer's own event loop rather than
prometheus-client's server thread: readiness is read where it is kept, and
no answer blocks the loop (a scrape renders a few dozen series). One request
per connection; a client that is slow or sends too much is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from http import HTTPStatus

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from semel.consumer.errors import ListenError
from semel.consumer.ops.health import Health
from semel.consumer.ops.metrics import Metrics

READ_TIMEOUT = 5.0  # seconds a client gets to send its request and read the answer
REQUEST_LIMIT = 8192  # bytes of request line and headers
_JSON = "application/json"
_CLIENT_TROUBLE = (
    TimeoutError,
    ConnectionError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
)
# Probes and scrapers reach the pod from outside, on every interface.
_ALL_INTERFACES = "0.0.0.0"  # noqa: S104

log = structlog.get_logger("semel.httpd")

Answer = tuple[HTTPStatus, str, bytes]


class OperationsServer:
    """Answers the three paths; everything else is 404."""

    def __init__(self, registry: CollectorRegistry, health: Health) -> None:
        self._registry = registry
        self._health = health

    def answer(self, method: str, target: str) -> Answer:
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, _JSON, b'{"error":"method not allowed"}'
        path = target.split("?", 1)[0]
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        stopped = self._health.stopped_for()
        if path in ("/healthz", "/readyz") and stopped is not None:
            # Alive in name only: nothing is consumed until a restart, which is what
            # a failing liveness probe brings about.
            answer = {"status": "stopped", "reason": stopped}
            return HTTPStatus.SERVICE_UNAVAILABLE, _JSON, orjson.dumps(answer)
        if path == "/healthz":
            return HTTPStatus.OK, _JSON, b'{"status":"alive"}'
        if path == "/readyz":
            checks = self._health.readiness()
            ready = all(checks.values())
            body: dict[str, str | None] = {"status": "ready" if ready else "not ready"}
            body |= {name: "up" if up else "down" for name, up in checks.items()}
            body["node"] = self._health.broker_node()
            if (outbox := self._health.outbox()) is not None:
                body["outbox"] = outbox  # shown, never a reason to be unready
            status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            return status, _JSON, orjson.dumps(body)
        return HTTPStatus.NOT_FOUND, _JSON, b'{"error":"not found"}'

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(request_line) == 3:
                method, target, _version = request_line
                status, content_type, body = self.answer(method, target)
            else:
                method, status, content_type, body = "GET", HTTPStatus.BAD_REQUEST, _JSON, b"{}"
            writer.write(
                (
                    f"HTTP/1.1 {status.value} {status.phrase}\r\n"
                    f"Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                ).encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except _CLIENT_TROUBLE:
            pass  # the client went away, dawdled or sent too much: nothing to answer
        finally:
            writer.close()


async def open_operations(port: int, metrics: Metrics) -> AsyncIterator[Health]:
    """The container's Resource: serve the endpoint on ``port`` (unless 0), hand out health."""
    health = Health()
    server: asyncio.Server | None = None
    if port:
        handler = OperationsServer(metrics.registry, health)
        try:
            server = await asyncio.start_server(
                handler.serve,
                _ALL_INTERFACES,
                port,
                limit=REQUEST_LIMIT,
                reuse_address=True,
            )
        except OSError as exc:
            raise ListenError(
                f"SEMEL_METRICS_PORT: cannot listen on port {port}: {exc.strerror or exc}"
            ) from None
        log.info("serving metrics and health", port=port)
    try:
        yield health
    finally:
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), READ_TIMEOUT)
        await health.close()
