"""``semel dlq migrate``: an earlier version's ``Q.dlq`` moved into the dead letters' stream.

The old queue is consumed with a bounded prefetch and manual acks: each
delivery gets a confirmed copy in the stream first, its ack after, so a run
killed at any point loses nothing; what it had copied but not acknowledged is
delivered again to the next run and copied again under the same letter id,
taken from its content (:func:`semel.consumer.letters.log.content_id`), so a
reader still sees each letter once. Never ``basic.get`` and ``nack``: each
hand-back would reorder the queue and, on RabbitMQ 4, wear its delivery limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import timedelta

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import ChannelNotFoundEntity

from semel.consumer.broker.copies import carried_headers, copy_message, stream_safe_headers
from semel.consumer.letters.log import append_letters, content_id, read_log
from semel.consumer.letters.transfer import amqp_value
from semel.consumer.letters.writing import carry_forward, writer_lock
from semel.consumer.names import BROKER_CALL_TIMEOUT, DLQ_ROUTING_KEY, H_LETTER_ID, Topology

MIGRATE_PREFETCH = 200  # deliveries of the old Q.dlq held unacknowledged at most
MIGRATE_IDLE = 1.0  # seconds without a delivery before the old queue's depth is asked


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def stream_copy(message: AbstractIncomingMessage) -> aio_pika.Message:
    """An old ``Q.dlq`` delivery as a letter: the broker's headers dropped, the id from
    its content (so moving it again, after a killed run, gives the same letter)."""
    headers = carried_headers(message.headers or {})
    letter_id = _text(headers.get(H_LETTER_ID))
    if not letter_id:
        letter_id = content_id(message.body, headers, message.message_id)
    # A non-UTF-8 text header reads as bytes, which the client cannot send back.
    safe = stream_safe_headers({name: amqp_value(value) for name, value in headers.items()})
    safe[H_LETTER_ID] = letter_id
    return copy_message(message, safe)


async def old_queue_depth(connection: AbstractConnection, names: Topology) -> int | None:
    """Ready messages in the earlier version's ``Q.dlq``; ``None`` when there is none."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(names.dead_letter_queue, passive=True)
        return queue.declaration_result.message_count or 0
    except ChannelNotFoundEntity:
        return None
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)


async def _batch(
    inbox: asyncio.Queue[AbstractIncomingMessage], size: int
) -> list[AbstractIncomingMessage]:
    try:
        batch = [await asyncio.wait_for(inbox.get(), MIGRATE_IDLE)]
    except TimeoutError:
        return []
    while len(batch) < size and not inbox.empty():
        batch.append(inbox.get_nowait())
    return batch


async def _move_once(
    connection: AbstractConnection, channel: AbstractChannel, names: Topology, prefetch: int
) -> int:
    """Consume ``Q.dlq`` until it has nothing ready: a confirmed stream copy of each
    delivery, then its ack (a killed run leaves the unacknowledged ones there)."""
    consumer = await connection.channel()
    moved = 0
    try:
        await consumer.set_qos(prefetch_count=prefetch)
        queue = await consumer.declare_queue(names.dead_letter_queue, passive=True)
        # The stream is bound to the DLX already (read_log found it): unbinding the old
        # queue means nothing new lands in it while it is emptied.
        await queue.unbind(names.dead_letter_exchange, routing_key=DLQ_ROUTING_KEY)
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(inbox.put, no_ack=False)
        while True:
            batch = await _batch(inbox, prefetch)
            if not batch:
                if not await old_queue_depth(connection, names):
                    return moved
                continue
            await append_letters(channel, names, [stream_copy(m) for m in batch])
            # One consumer's deliveries arrive in order: acking the last acks the batch.
            await batch[-1].ack(multiple=True)
            moved += len(batch)
    finally:
        # Closing hands back whatever was delivered but not acknowledged.
        if not consumer.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.close(), BROKER_CALL_TIMEOUT)


async def move_old_queue(
    connection: AbstractConnection,
    channel: AbstractChannel,
    names: Topology,
    *,
    prefetch: int = MIGRATE_PREFETCH,
) -> int:
    """Every dead letter of ``Q.dlq`` into the stream; how many were moved.

    Call it under the writers' lock. ``channel`` must have publisher confirms.
    """
    moved = 0
    while True:
        moved += await _move_once(connection, channel, names, prefetch)
        # A delivery that was on its way when the consumer stopped is ready again.
        if not await old_queue_depth(connection, names):
            return moved


async def delete_old_queue(connection: AbstractConnection, names: Topology) -> bool:
    """Delete ``Q.dlq`` if it is empty and nobody consumes it; whether it was deleted.

    Checked first, then deleted: a quorum queue refuses ``if-empty`` (and the
    broker closes the whole connection for it). Nothing can arrive in between:
    the queue is unbound from the DLX, and a consumer holding messages shows.
    """
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(names.dead_letter_queue, passive=True)
        result = queue.declaration_result
        if result.message_count or result.consumer_count:
            return False
        await channel.queue_delete(names.dead_letter_queue)
        return True
    except ChannelNotFoundEntity:
        return True
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)


@dataclass(frozen=True, slots=True)
class Migrated:
    found: bool  # whether there was a Q.dlq at all
    moved: int
    deleted: bool
    carried: int


async def migrate(
    connection: AbstractConnection,
    channel: AbstractChannel,
    names: Topology,
    *,
    keep_queue: bool,
    retention: timedelta,
) -> Migrated:
    """Move an earlier version's ``Q.dlq`` into the stream, and delete it when empty
    unless ``keep_queue``."""
    if await old_queue_depth(connection, names) is None:
        return Migrated(found=False, moved=0, deleted=False, carried=0)
    async with writer_lock(connection, names):
        state = await read_log(connection, names, archive_retention=retention)
        moved = await move_old_queue(connection, channel, names)
        deleted = False if keep_queue else await delete_old_queue(connection, names)
        carried = await carry_forward(channel, names, state)
        return Migrated(found=True, moved=moved, deleted=deleted, carried=carried)
