"""The test proxy itself: closing it leaves no socket to the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from tests.proxy import TcpProxy
from tests.servers import free_port


@pytest.mark.timeout(20)
async def test_a_connection_accepted_while_stalled_is_closed_by_close() -> None:
    # A client that connects to a stalled link (a pool reconnecting during a
    # stall) is accepted but never piped; its socket must still be closed.
    target = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    proxy = await TcpProxy(target.sockets[0].getsockname()[1], free_port()).start()
    proxy.stall()
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    deadline = asyncio.get_running_loop().time() + 5
    while not proxy._tasks:  # accepted: its task waits for the link to flow
        assert asyncio.get_running_loop().time() < deadline, "never accepted"
        await asyncio.sleep(0.01)
    await proxy.close()
    writer.close()
    target.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaked = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaked, [str(w.message) for w in leaked]
