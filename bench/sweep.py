"""A case's queues and exchanges found by name on the broker, not from this checkout's
topology: another revision of semel declares its own, with arguments (and perhaps
queues) of its own.

Every name of a case starts with its work queue's name (``Q``, ``Q.events``,
``Q.retry.conflict``, ``Q.dlq`` ...). Each passive declare runs on a channel of
its own, since the broker closes the channel of one that names no queue.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable

import aio_pika
from aiormq.exceptions import ChannelNotFoundEntity

from bench.broker import AMQP_URL, BenchError

DECLARED_WITHIN = 60.0  # seconds a consumer gets to declare its topology and consume
POLL = 0.05


def _listed(what: str, prefix: str) -> list[str]:
    names = subprocess.run(
        ["rabbitmqctl", what, "name", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if name == prefix or name.startswith(f"{prefix}.")]


async def _count(connection: aio_pika.abc.AbstractConnection, queue: str) -> tuple[int, int]:
    """Ready messages and consumers of ``queue``; (-1, 0) if there is no such queue."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return -1, 0
    result = declared.declaration_result
    if not channel.is_closed:
        await channel.close()
    return int(result.message_count or 0), int(result.consumer_count or 0)


async def leftovers(prefix: str) -> dict[str, int]:
    """Messages still ready in any queue of the case."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        queues = _listed("list_queues", prefix)
        counts = {name: (await _count(connection, name))[0] for name in queues}
    finally:
        await connection.close()
    return {name: count for name, count in counts.items() if count > 0}


async def remove(prefix: str) -> None:
    """Delete every queue and exchange of the case."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        for queue in _listed("list_queues", prefix):
            await channel.queue_delete(queue)
        for exchange in _listed("list_exchanges", prefix):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


async def consuming(queue: str, alive: Callable[[], bool]) -> None:
    """Return once ``queue`` has a consumer: whoever consumes it has declared it, its
    bindings and the rest of its topology first."""
    deadline = time.monotonic() + DECLARED_WITHIN
    connection = await aio_pika.connect(AMQP_URL)
    try:
        while (await _count(connection, queue))[1] == 0:
            if not alive():
                raise BenchError(f"{queue}: the consumer exited before consuming")
            if time.monotonic() > deadline:
                raise BenchError(f"{queue}: nothing consumed it within {DECLARED_WITHIN:g}s")
            await asyncio.sleep(POLL)
    finally:
        await connection.close()
