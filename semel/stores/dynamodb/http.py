"""A small HTTP/1.1 client for one endpoint: kept-alive connections, one request each at a time.

DynamoDB's API is ``POST /`` with a JSON body, answered with a body of known
length, so a connection is an :class:`asyncio.Protocol` that writes one whole
request and reads one head and ``Content-Length`` bytes: no streaming, no
chunked bodies, no redirects, no proxies (the store keeps botocore for an
endpoint behind a proxy). Failures are botocore's exceptions of the same
kind, so the store sorts them exactly as it sorts botocore's own.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import cast

from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
    SSLError,
)

HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class ProtocolError(HTTPClientError):
    """An answer that is not the HTTP/1.1 this client reads."""

    fmt = "An HTTP client error occurred: {error}"


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(rest[:3]), headers


class Connection(asyncio.Protocol):
    """One kept-alive connection: a request is written whole, its answer read whole."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._head: tuple[int, dict[str, str], int] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not asyncio's classes.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: this connection is out of step
            return
        self._buffer += data
        try:
            response = self._response()
        except ValueError as exc:
            self._fail(ProtocolError(error=exc))
            return
        if response is not None:
            if response.headers.get("connection", "").lower() == "close":
                self.close()
            waiter.set_result(response)

    def _response(self) -> Response | None:
        """The whole answer once it is in the buffer; ``None`` until then."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > HEAD_LIMIT:
                    raise ValueError("response head too long")
                return None
            status, headers = _head(bytes(self._buffer[:end]))
            if "content-length" not in headers:
                raise ValueError("a response without Content-Length")
            self._head = status, headers, int(headers["content-length"])
            del self._buffer[: end + 4]
        status, headers, length = self._head
        if len(self._buffer) < length:
            return None
        if len(self._buffer) > length:
            raise ValueError("more bytes than the response's Content-Length")
        body = bytes(self._buffer)
        self._buffer.clear()
        self._head = None
        return Response(status, headers, body)

    def eof_received(self) -> bool:
        self._fail(ConnectionClosedError(endpoint_url=self._endpoint))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionClosedError(endpoint_url=self._endpoint))

    def _fail(self, error: Exception) -> None:
        self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            # Aborted, not closed: nothing this client still wants is in flight, and a TLS
            # close waits (up to 30 s) for the server's close_notify, which a server gone
            # silent never sends. A loop closed meanwhile would leave the socket open, and
            # uvloop's close, where ResourceWarning is an error, would never return.
            self._transport.abort()

    def _time_out(self) -> None:
        self._fail(ReadTimeoutError(endpoint_url=self._endpoint))

    async def exchange(self, request: bytes, patience: float) -> Response:
        """Write ``request``, wait up to ``patience`` seconds for its whole answer."""
        assert self._transport is not None
        assert self._waiter is None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Response] = loop.create_future()
        self._waiter = waiter
        self._transport.write(request)
        # A timer rather than asyncio.timeout(): no context manager per request.
        timer = loop.call_later(patience, self._time_out)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None


class Pool:
    """Up to ``size`` connections to one host, kept alive between requests."""

    def __init__(
        self,
        endpoint: str,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        size: int,
        connect_timeout: float,
    ) -> None:
        self._endpoint = endpoint
        self._host = host
        self._port = port
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        opening = loop.create_connection(
            lambda: Connection(self._endpoint),
            self._host,
            self._port,
            ssl=self._tls,
            server_hostname=self._host if self._tls else None,
        )
        try:
            _, connection = await asyncio.wait_for(opening, self._connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=self._endpoint) from exc
        except ssl.SSLError as exc:
            # botocore's error for a refused handshake: it names the certificate's fault
            # (the host name, an unknown CA), where "could not connect" would not.
            raise SSLError(endpoint_url=self._endpoint, error=exc) from exc
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=self._endpoint, error=exc) from exc
        self._open.add(connection)
        return connection

    async def send(self, request: bytes, patience: float) -> Response:
        """One request on an idle connection (or a new one) and its answer."""
        async with self._slots:
            connection = None
            while self._idle:
                # The server closes idle connections (dynalite after 5 s): take a live one.
                candidate = self._idle.pop()
                if not candidate.closed:
                    connection = candidate
                    break
                self._open.discard(candidate)
            if connection is None:
                connection = await self._connect()
            try:
                response = await connection.exchange(request, patience)
            except BaseException:
                # Timed out, cut, or the caller gave up (cancelled): the answer may
                # still come, so this connection can carry nothing else.
                connection.close()
                self._open.discard(connection)
                raise
            if connection.closed:
                self._open.discard(connection)
            else:
                self._idle.append(connection)
            return response

    def close(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
