"""What only the one writer of a dead letters' stream does: hold the lock, copy forward.

Readers need nothing of this; every command that appends events or letters
takes :func:`writer_lock` first, reads the stream under it, and ends with
:func:`carry_forward` (why: :mod:`semel.consumer.letters.log`, "Retention").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelLockedResource

from semel.consumer.letters.log import Letter, LogError, LogState, append_letters
from semel.consumer.names import BROKER_CALL_TIMEOUT, H_CARRIED_AT, Topology

LOCK_POLL = 0.5
# How long a writer waits for the lock: long enough for the broker to notice
# that a killed command's connection is gone (and its lock with it).
LOCK_WAIT = 5.0
CARRY_AFTER = timedelta(days=7)  # a letter's newest copy this old is copied forward


class LogBusy(LogError):
    """Another ``semel dlq`` command holds the writers' lock."""


@contextlib.asynccontextmanager
async def writer_lock(
    connection: AbstractConnection, names: Topology, *, wait: float = LOCK_WAIT
) -> AsyncIterator[None]:
    """Hold the one lock of the commands that append events or copies.

    An exclusive queue: the broker deletes it when its connection goes, so a
    killed command never leaves it behind. Raises :class:`LogBusy` when another
    command still holds it after ``wait`` seconds.
    """
    deadline = time.monotonic() + wait
    while True:
        channel = await connection.channel()
        try:
            lock = await channel.declare_queue(
                names.dead_letter_lock, exclusive=True, auto_delete=True, durable=False
            )
            break
        except ChannelLockedResource:
            if time.monotonic() >= deadline:
                raise LogBusy(
                    f"another `semel dlq` command is changing the dead letters of "
                    f"{names.queue!r} ({names.dead_letter_lock} is held); try again when it ends"
                ) from None
            await asyncio.sleep(LOCK_POLL)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                lock.delete(if_unused=False, if_empty=False), BROKER_CALL_TIMEOUT
            )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)


def carried_copy(letter: Letter, now: datetime) -> aio_pika.Message:
    return letter.message(letter.headers | {H_CARRIED_AT: now.isoformat()})


async def carry_forward(
    channel: AbstractChannel, names: Topology, state: LogState, *, now: datetime | None = None
) -> int:
    """Copy forward every letter whose newest copy is older than :data:`CARRY_AFTER`,
    so the stream's age retention never takes a letter still there. Call it only
    under :func:`writer_lock`, with ``state`` read under it."""
    now = now or datetime.now(UTC)
    due = [letter for letter in state.letters.values() if now - letter.written_at >= CARRY_AFTER]
    return await append_letters(channel, names, (carried_copy(letter, now) for letter in due))
