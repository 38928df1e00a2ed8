"""The worker's keeper of the dead letters: live ones are copied forward in time.

The dead letters' stream drops records older than its max age
(:data:`semel.consumer.broker.topology.DEAD_LETTER_LOG_ARGS`). Every ``semel
dlq`` command that writes copies forward the letters whose newest copy is a
week old (:func:`semel.consumer.letters.writing.carry_forward`), but an incident
nobody looks at for three weeks must not lose its letters either: so a
running worker does the same every :data:`KEEP_INTERVAL`, for each queue it
consumes. One worker does it at a time (the writers' lock; a worker that
finds it held skips the round), and a round that fails is tried again at the
next.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import structlog
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import AMQPError

from semel.consumer.letters.log import LogError, read_log
from semel.consumer.letters.writing import LogBusy, carry_forward, writer_lock
from semel.consumer.names import Topology
from semel.consumer.tasks import running

KEEP_INTERVAL = 6 * 3600.0  # seconds between rounds; the margin is two weeks
log = structlog.get_logger("semel.dead_letters")


async def keep_once(
    connection: AbstractConnection, names: Topology, archive_retention: timedelta | None
) -> int | None:
    """One round for one queue: how many letters were copied forward (``None``: another
    command or worker holds the lock)."""
    try:
        async with writer_lock(connection, names, wait=0.0):
            state = await read_log(connection, names, archive_retention=archive_retention)
            channel = await connection.channel(publisher_confirms=True)
            try:
                return await carry_forward(channel, names, state)
            finally:
                if not channel.is_closed:
                    await channel.close()
    except LogBusy:
        return None


async def keep_periodically(
    connection: AbstractConnection,
    queues: Sequence[Topology],
    archive_retention: timedelta | None,
    interval: float = KEEP_INTERVAL,
) -> None:
    """Keep every queue's dead letters every ``interval`` seconds until cancelled.

    The first round comes at a random point of the first interval, so workers
    started together do not all read the stream at once.
    """
    while True:
        await asyncio.sleep(random.uniform(0.1, 1.0) * interval)
        for names in queues:
            try:
                carried = await keep_once(connection, names, archive_retention)
            except (TimeoutError, LogError, AMQPError, ConnectionError) as exc:
                log.warning("dead letters not kept this round", queue=names.queue, error=str(exc))
                continue
            if carried:
                log.info("dead letters copied forward", queue=names.queue, letters=carried)


async def background_keeper(
    connection: AbstractConnection,
    queues: Sequence[Topology],
    archive_retention: timedelta | None,
) -> AsyncIterator[None]:
    """The container's Resource: keep the dead letters while the worker runs."""
    async with running(keep_periodically(connection, queues, archive_retention)):
        yield None
