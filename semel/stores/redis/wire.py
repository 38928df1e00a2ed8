"""Packed commands to one or several Redis servers, and their replies, in one round trip.

redis-py's ``execute_command`` sends one command and reads its reply, in a
retry loop (which the store sets to never resend), with metric hooks and an
encoder that takes any argument type one at a time. The store packs its own
commands (:mod:`semel.stores.redis.eval`) and writes a server's share of a batch
at once on a connection borrowed from the client's own pool, then reads the
replies in order.

Several servers (the nodes a Redis Cluster batch touches) are written to
first and read from after, by the calling task alone under one deadline:
the round trip lasts as long as the slowest server, as with a task per
server, without the tasks, and with one timer rather than one per server
or per reply (a timer per reply cost a Cluster batch more than its
parsing).

A connection is never given back half read. The connection layer drops a
connection on any error but a server's error reply, exactly as under
``execute_command``, and a deadline that passes cancels the read it cuts
short, which drops that connection too; connections whose replies were
never read are dropped here. An error reply is read whole and handed back
in place of its command's reply.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Sequence
from typing import Any

from redis.exceptions import ConnectionError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from semel.stores.redis.lender import Source

Replies = list[Any] | Exception
"""A server's replies in order, or the error that cut it off (the commands may have run)."""


async def exchange(rounds: Sequence[tuple[Source, Sequence[bytes]]]) -> list[Replies]:
    """Write each source's ``commands``, then read a reply for each, for every source.

    Replies come back as bytes whatever the URL asks the client to decode: the
    store reads them itself. A server that cannot be reached, or whose
    connection fails or runs out of time, answers its error instead; the others
    answer as usual.
    """
    trip = _Trip(rounds)
    try:
        await trip.borrow()
        await trip.run()
        return trip.answers()
    finally:
        await trip.give_back()


class _Trip:
    """One :func:`exchange`: the connections it borrowed, and what each server answered."""

    def __init__(self, rounds: Sequence[tuple[Source, Sequence[bytes]]]) -> None:
        self.rounds = rounds
        self.answered: dict[int, Replies] = {}
        self.borrowed: dict[int, Any] = {}
        self.unread: set[int] = set()  # written to, and not all read yet

    async def borrow(self) -> None:
        for i, (source, _) in enumerate(self.rounds):
            try:
                self.borrowed[i] = await source.get_connection()
            except (RedisError, OSError) as exc:
                self.answered[i] = exc

    async def run(self) -> None:
        timeouts = [c.socket_timeout or math.inf for c in self.borrowed.values()]
        timeout = max(timeouts, default=math.inf)
        try:
            async with asyncio.timeout(None if timeout == math.inf else timeout):
                for i, conn in self.borrowed.items():
                    await self._attempt(i, _write(conn, b"".join(self.rounds[i][1])))
                for i in sorted(self.unread):
                    await self._attempt(i, _read(self.borrowed[i], len(self.rounds[i][1])))
        except TimeoutError:  # the write or read under way was cancelled, the rest never done
            for i, conn in self.borrowed.items():
                self.answered.setdefault(
                    i, RedisTimeoutError(f"Timeout reading from {_where(conn)}")
                )

    async def _attempt(self, i: int, step: Awaitable[list[Any] | None]) -> None:
        """A write (which answers None) or the read of server ``i``."""
        try:
            replies = await step
        except (RedisError, OSError) as exc:  # the connection is dropped already
            self.answered[i] = exc
            self.unread.discard(i)
            return
        if replies is None:
            self.unread.add(i)
        else:
            self.answered[i] = replies
            self.unread.discard(i)

    def answers(self) -> list[Replies]:
        return [self.answered[i] for i in range(len(self.rounds))]

    async def give_back(self) -> None:
        for i, conn in self.borrowed.items():
            if i in self.unread:  # replies left on it: never to be read by another caller
                await conn.disconnect(nowait=True)
            await self.rounds[i][0].release(conn)


async def _write(conn: Any, data: bytes) -> None:
    if not conn.is_connected:
        await conn.connect()
    try:
        # Not send_packed_command: it wraps every write in wait_for, a task and a
        # timer of its own; the round trip's deadline holds instead.
        await conn._send_packed_command([data])
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise ConnectionError(f"Error writing to {_where(conn)}: {exc}") from exc
    except BaseException:  # cut short: what was written is unknown, so it cannot be reused
        await conn.disconnect(nowait=True)
        raise


async def _read(conn: Any, count: int) -> list[Any]:
    replies: list[Any] = []
    for _ in range(count):
        try:
            # No timer of its own (math.inf): the round trip's deadline holds.
            replies.append(await conn.read_response(True, math.inf))
        except ResponseError as error:  # read whole: the next reply follows
            replies.append(error)
    return replies


async def send(source: Source, commands: Sequence[bytes]) -> list[Any]:
    """:func:`exchange` with one server; its error raised."""
    (replies,) = await exchange([(source, commands)])
    if isinstance(replies, Exception):
        raise replies
    return replies


def _where(conn: Any) -> str:
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return f"{host}:{port}" if host else "the Redis server"
