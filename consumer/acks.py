"""ACKs of the work queue's channel, sent in as few frames as settling order allows.

One ``basic.ack`` per message is a frame for the client to write and, on a
quorum queue, a settle command through the queue's Raft log for the broker.
Deliveries settled in the same turn of the event loop are acknowledged with
one ``basic.ack(multiple=True)`` up to the highest tag below every delivery
still open, plus one plain ``basic.ack`` for each tag above it, so a slow
handler never holds back the others' ACKs (nor the prefetch window).

Only ACKs are coalesced. A NACK goes out at once, and its tag counts as open
until it has been written, so no ``multiple`` ACK can cover it. Delivery tags
belong to one channel: when a reconnect brings a new channel, what was open on
the old one is forgotten (the broker requeued it when the channel closed).
"""

from __future__ import annotations

import asyncio
import contextlib

from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import AbstractChannel

Waiter = asyncio.Future[BaseException | None]


class Acks:
    """Tracks the deliveries of one consumer and acknowledges them in batches."""

    def __init__(self) -> None:
        self._channel: AbstractChannel | None = None
        self._open: set[int] = set()
        self._settled: dict[int, tuple[AbstractIncomingMessage, Waiter]] = {}
        self._scheduled = False
        self._sending: set[asyncio.Task[None]] = set()

    def delivered(self, message: AbstractIncomingMessage) -> None:
        """Called for every delivery, in the order the broker sent them."""
        channel = _channel_of(message)
        if channel is not self._channel:
            self._channel = channel
            self._open.clear()
            # Settled on the old channel but not yet sent: those ACKs can no
            # longer be delivered, and the broker has requeued the messages.
        if message.delivery_tag is not None:
            self._open.add(message.delivery_tag)

    async def ack(self, message: AbstractIncomingMessage) -> None:
        """ACK ``message`` with the next batch; raises what the ACK raised."""
        channel = _channel_of(message)
        if (
            channel is None
            or channel is not self._channel
            or message.delivery_tag not in self._open
        ):
            await message.ack()  # not tracked here (closed or replaced channel): as it is
            return
        self._open.discard(message.delivery_tag)
        waiter: Waiter = asyncio.get_running_loop().create_future()
        self._settled[message.delivery_tag] = (message, waiter)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        error = await waiter
        if error is not None:
            raise error

    async def nack(self, message: AbstractIncomingMessage, *, requeue: bool) -> None:
        """NACK ``message`` now; its tag stays open until the frame is written."""
        try:
            await message.nack(requeue=requeue)
        finally:
            if _channel_of(message) is self._channel and message.delivery_tag is not None:
                self._open.discard(message.delivery_tag)

    def _flush(self) -> None:
        self._scheduled = False
        settled, self._settled = self._settled, {}
        floor = min(self._open, default=None)
        below = sorted(tag for tag in settled if floor is None or tag < floor)
        sends: list[tuple[AbstractIncomingMessage, bool, list[Waiter]]] = []
        if below:
            # Every tag up to the highest one below the floor is settled: one frame.
            top = settled[below[-1]][0]
            sends.append((top, len(below) > 1, [settled[tag][1] for tag in below]))
        for tag in sorted(set(settled) - set(below)):
            message, waiter = settled[tag]
            sends.append((message, False, [waiter]))
        for message, multiple, waiters in sends:
            task = asyncio.get_running_loop().create_task(_send(message, multiple, waiters))
            self._sending.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._sending.discard)


async def _send(message: AbstractIncomingMessage, multiple: bool, waiters: list[Waiter]) -> None:
    error: BaseException | None = None
    try:
        await message.ack(multiple=multiple)
    except Exception as exc:  # handed to every settle waiting on this frame
        error = exc
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(error)


def _channel_of(message: AbstractIncomingMessage) -> AbstractChannel | None:
    with contextlib.suppress(Exception):  # a closed channel: the delivery is void
        return message.channel
    return None
