"""A turn of the DLQ: every dead letter read once, in order, none held for long.

A quorum queue can only be read by taking its messages, and RabbitMQ 3.10 has
no way to look at a message and leave it where it is. Streams can, but a
stream's confirmed records can be lost when its leader fails over
(rabbitmq-server#9457), and a dead letter is the one copy of a message semel
could not process. So dead letters stay in ``Q.dlq``, a quorum queue, and a
command reads them by turning the queue once: each letter is taken from the
head and, unless the command removes it, a copy goes to the tail, confirmed,
before the letter is acked.

What a turn guarantees:

- **Bounded.** At most ``window`` letters are unacknowledged at any moment
  (the consumer's prefetch), whatever the queue holds.
- **Nothing lost.** A letter is acked only after its copy (to the tail, or to
  where a replay sends it) was confirmed; a command killed at any point leaves
  every letter in the queue. A letter whose copy was confirmed but which was
  not yet acked comes back too: two copies with one letter id, and the next
  turn keeps the first and drops the second (:data:`names.H_LETTER_ID`). A
  killed turn also leaves the queue rotated: the letters it had copied now
  follow those it had not reached.
- **Nothing worn.** Every letter is acked, never handed back, so no
  delivery-limit count is spent (RabbitMQ 4 counts every return); each copy
  starts again with none.
- **Order kept.** A turn takes exactly the letters the queue held when it
  started (its depth) and publishes their copies in that order, on one
  channel. Its prefetch and its acks are arranged so that the broker cannot
  deliver more than the depth
  (:meth:`semel.consumer.broker.turn_flow.Flow.ackable`): a letter that arrives
  during the turn is not taken, and lands among the copies, where it arrived.
  Should the queue hold fewer than its depth said (a letter expired at the
  head, or another consumer took one), a copy of this very turn can come
  round: each copy carries the turn's id (:data:`names.H_TURN`), and the turn ends
  at the first one it meets, never taking it for a second copy of its letter
  (which would drop it). It and whatever else came are copied to the tail
  as they are: nothing lost or doubled, the letters whose copies came round
  now behind the others.
- **One at a time.** A turn holds a lock, the exclusive queue
  ``Q.dlq.lock``, which the broker deletes with the command's connection; a
  second command exits naming it (:class:`LockHeld`).
"""

from __future__ import annotations

import contextlib

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import AMQPError, ChannelLockedResource

from semel.consumer.broker.dead_letters import letter_id
from semel.consumer.broker.turn_actions import (
    WINDOW,
    Action,
    Decide,
    Drop,
    Keep,
    Letter,
    Pace,
    Send,
    TurnReport,
    kept_copy,
    new_letter_id,
    tail_properties,
)
from semel.consumer.broker.turn_flow import Flow
from semel.consumer.errors import SemelError

# A turn's API in one place: what a command's ``decide`` returns and is given.
__all__ = [
    "Action",
    "Decide",
    "Drop",
    "Keep",
    "Letter",
    "LockHeld",
    "Send",
    "TurnReport",
    "hold_lock",
    "kept_copy",
    "letter_id",
    "new_letter_id",
    "tail_properties",
    "turn",
]

LOCK_SUFFIX = ".lock"


class LockHeld(SemelError):
    """Another command is turning this DLQ (exit 1, one line)."""


async def turn(
    connection: AbstractConnection,
    channel: aio_pika.abc.AbstractChannel,
    dead_letter_queue: str,
    decide: Decide,
    *,
    window: int = WINDOW,
    rate: float | None = None,
) -> TurnReport:
    """Turn ``dead_letter_queue`` once, doing with each letter what ``decide`` says.

    The depth is read on ``channel``; the letters are taken and copied on a
    channel of the turn's own, opened on ``connection``, so its prefetch and
    acks touch nothing else, and an error that closes it leaves ``channel``
    open. ``rate`` paces the :class:`Send` actions only. Raises
    :class:`LockHeld` when another command holds the queue; any broker error
    stops the turn with every letter not yet acked still in the queue.
    """
    await hold_lock(connection, dead_letter_queue)
    declared = await channel.declare_queue(dead_letter_queue, passive=True)
    report = TurnReport(depth=declared.declaration_result.message_count or 0)
    if report.depth == 0:
        return report
    own = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        flow = Flow(connection, own, dead_letter_queue, decide, min(window, report.depth), report)
        await flow.run(Pace(rate))
    finally:
        # Closing hands back what is still unacked (only after a failure).
        with contextlib.suppress(AMQPError, ConnectionError, RuntimeError):
            await own.close()
    return report


async def hold_lock(connection: AbstractConnection, dead_letter_queue: str) -> None:
    """Take the DLQ's lock for as long as ``connection`` lasts (again: a no-op)."""
    name = dead_letter_queue + LOCK_SUFFIX
    # Declared on a channel of its own: a refusal closes the channel it came on.
    lock_channel = await connection.channel()
    try:
        await lock_channel.declare_queue(name, exclusive=True, auto_delete=True)
    except ChannelLockedResource:
        raise LockHeld(
            f"another semel dlq command is running on {dead_letter_queue} (it holds {name})"
        ) from None
    # The queue belongs to the connection: the channel has done its part.
    with contextlib.suppress(AMQPError, ConnectionError, RuntimeError):
        await lock_channel.close()
