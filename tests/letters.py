"""Reading a queue's dead letters back in tests: the live letters of ``Q.dead-letters``.

The stream is read the way ``semel dlq list`` reads it
(:func:`semel.consumer.letters.log.read_log`): every reading appends one small
``mark`` record and removes nothing, so a test may read as often as it likes
and sees the same letters each time, until an event ends them.
"""

from __future__ import annotations

import asyncio
import time

from aio_pika.abc import AbstractConnection

from semel.consumer.letters.log import Letter, read_log
from semel.consumer.names import Topology

POLL = 0.1  # between readings: each one appends a record and reads the stream whole


async def dead_letters(connection: AbstractConnection, queue: str) -> list[Letter]:
    """The live (not archived) dead letters of ``queue``, in stream order."""
    state = await read_log(connection, Topology(queue))
    return state.live()


async def count_dead_letters(connection: AbstractConnection, queue: str) -> int:
    return len(await dead_letters(connection, queue))


async def wait_for_dead_letters(
    connection: AbstractConnection, queue: str, expected: int, deadline: float = 15.0
) -> list[Letter]:
    """The live dead letters once there are exactly ``expected`` of them.

    Raises ``AssertionError`` naming the last count when ``deadline`` seconds pass
    first (more than ``expected`` is a failure too, once the deadline is over).
    """
    end = time.monotonic() + deadline
    while True:
        letters = await dead_letters(connection, queue)
        if len(letters) == expected:
            return letters
        if time.monotonic() > end:
            raise AssertionError(
                f"{Topology(queue).dead_letter_log}: {len(letters)} live dead letters, "
                f"not {expected}, after {deadline:g}s"
            )
        await asyncio.sleep(POLL)
