"""A TCP forwarder between a client and a server that a test can cut, stall or slow.

- :meth:`TcpProxy.cut` drops every connection and refuses new ones: a server
  gone, seen at once as a reset.
- :meth:`TcpProxy.stall` stops forwarding without closing anything: the
  client's bytes are still acknowledged by this host's kernel, so to the
  client it looks exactly like packets dropped on the way (no reset, no
  answer, no error) until its own deadline fires. New connections are
  accepted and hang the same way.
- :attr:`TcpProxy.delay` holds every chunk that long in each direction, in
  order: a slow store, or a slow link to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port``."""

    def __init__(self, target_port: int, listen_port: int, *, delay: float = 0.0) -> None:
        self.target_port = target_port
        self.port = listen_port
        self.delay = delay
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        return self

    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links) // 2  # each has the client's side and the server's

    async def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def stall(self) -> None:
        """Stop forwarding, in both directions, on every connection; close nothing."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again what was held and everything after it."""
        self._flowing.set()

    async def close(self) -> None:
        await self.cut()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._flowing.wait()  # a stalled link accepts, then never connects on
            try:
                server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                client_w.transport.abort()
                return
            self._links |= {client_w, server_w}
            await asyncio.gather(
                self._pipe(client_r, server_w),
                self._pipe(server_r, client_w),
                return_exceptions=True,
            )
            self._links -= {client_w, server_w}
        except asyncio.CancelledError:
            pass  # closed by close(): the top of a connection's own task, nobody awaits it
        finally:
            # A connection accepted while the link stalled never reached a pipe:
            # closed here, or its socket is left to the garbage collector.
            client_w.transport.abort()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Reading and writing are apart so a delay holds each chunk for that
        # long, not the whole stream: latency, not a bandwidth limit.
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forwarder = asyncio.create_task(self._forward(held, writer))
        try:
            while data := await reader.read(65536):
                await held.put((time.monotonic() + self.delay, data))
            await held.put((0.0, b""))
            await forwarder
        except (ConnectionError, OSError):
            pass
        finally:
            forwarder.cancel()
            writer.transport.abort()

    async def _forward(
        self, held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                due, data = await held.get()
                if not data:
                    return
                await self._flowing.wait()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
