"""The FastStream middleware: a ``RabbitBroker``'s or ``RabbitRouter``'s subscribers
get semel's behaviour for every delivery.

``RabbitBroker(url, middlewares=[semel.faststream()])``. Each delivery of a
subscriber's queue goes through that queue's :class:`Door`: the key read and
claimed, the subscriber run under the renewed lease, the outcome recorded and
settled by semel's confirmed copies (retry tiers, conflict queue, DLQ). The
handler reads its key, fence and attempt from FastStream's context,
``Context("semel")``, or from :func:`semel.consumer.embedded.current`.

Settling and FastStream. A delivery semel settled itself (a retry copy, a
dead letter, a parked or handed-back copy) ends the scope with
:class:`Settled`, a FastStream ``AckMessage``: FastStream publishes no reply for
it and its own acknowledgement finds the message already settled. A completed
delivery returns the handler's result, and a duplicate the stored one, so
FastStream publishes the reply (or ``@publisher`` output) as it would; the ACK
is sent only after that, when FastStream leaves the middleware: a crash in
between redelivers the message, and its duplicate publishes the stored reply
again. A reply that fails to publish hands the message back the same way.
Supported: FastStream 0.6 and 0.7, with ``faststream[rabbit]``.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from faststream import BaseMiddleware
from faststream.exceptions import AckMessage

from semel.consumer.delivery.decide import Ack, Outcome
from semel.consumer.delivery.handler import Context
from semel.consumer.embedded.door import Door, Doors, Passage
from semel.consumer.errors import ConfigurationError

CONTEXT_NAME = "semel"  # FastStream's Context("semel") in a subscriber's signature
_REPLIED = (Outcome.COMPLETED, Outcome.DUPLICATE)


class Settled(AckMessage):
    """semel settled the delivery itself: FastStream publishes nothing for it."""

    def __str__(self) -> str:
        return "settled by semel"


def queue_of(context: Any) -> str | None:
    """The name of the queue the delivery came from: the subscriber FastStream is
    running (``handler_`` in its context), as it declared it. ``None`` for what
    is no subscriber's delivery (the reply to the application's own request)."""
    subscriber = context.get_local("handler_") or context.get("handler_")
    declared = getattr(subscriber, "_queue_obj", None)
    if declared is not None:
        return str(declared.name)
    queue = getattr(subscriber, "queue", None)
    return None if queue is None else str(queue.name)


class _Subscriber:
    """The subscriber's own call for one delivery, which the pipeline runs as its
    handler; the subscriber's reply is kept for the middleware to return."""

    __slots__ = ("call_next", "msg", "replied", "reply", "repository")

    def __init__(self, call_next: Any, msg: Any, repository: Any) -> None:
        self.call_next = call_next
        self.msg = msg
        self.repository = repository  # the middleware's, not the middleware: no cycle
        self.replied = False
        self.reply: Any = None

    async def __call__(self, context: Context) -> Any:
        # Set, not scoped: this runs in the delivery's own task (see Door.start),
        # whose context goes with it, so there is nothing to restore.
        self.repository.set_local(CONTEXT_NAME, context)
        self.reply = await self.call_next(self.msg)
        self.replied = True
        return self.reply


class SemelMiddleware(BaseMiddleware):
    """One delivery's middleware (FastStream builds one per message)."""

    __slots__ = ("_door", "_passage", "_raw", "_semel")

    def __init__(self, msg: Any, /, *, context: Any, semel: Doors) -> None:
        super().__init__(msg, context=context)
        self._semel = semel
        self._door: Door | None = None
        self._passage: Passage | None = None
        self._raw: Any = None

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        queue = queue_of(self.context)
        if queue is None:
            return await call_next(msg)
        self._raw = raw = msg.raw_message
        if raw.processed:
            # AckPolicy.ACK_FIRST consumes with no_ack: the broker forgot the
            # message before anything ran, and a crash now loses it. semel
            # cannot keep its promises there, so it says so instead of pretending.
            raise ConfigurationError(
                f"queue {queue!r}: the subscriber consumes with AckPolicy.ACK_FIRST (no_ack); "
                "semel settles each delivery itself: use the default ack policy"
            )
        door = self._semel.opened(queue) or await self._semel.door(queue)
        self._door = door
        subscriber = _Subscriber(call_next, msg, self.context)
        self._passage = passage = Passage(subscriber, defer_ack=True)
        task = door.start(raw, passage)
        try:
            decision = await asyncio.shield(task)
        except asyncio.CancelledError:
            # FastStream's task is cancelled (the channel closed under it, or
            # the app is stopping): the delivery goes on in semel's task, and
            # with nobody left to publish a reply it settles by itself.
            passage.defer_ack = False
            raise
        if isinstance(decision, Ack) and decision.outcome in _REPLIED:
            if decision.outcome is Outcome.COMPLETED and subscriber.replied:
                return subscriber.reply
            claim = passage.claim
            return None if claim is None else claim.record.result
        raise Settled

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        door, passage, raw = self._door, self._passage, self._raw
        # Let go of the delivery's objects now rather than when the middleware
        # goes: an exception's traceback may hold this frame for a while.
        self._door = self._passage = self._raw = None
        if door is None or passage is None:
            return False
        ok = exc_val is None or isinstance(exc_val, Settled)
        await door.finish(raw, passage, ack=ok)
        return isinstance(exc_val, Settled) or None


class _Factory:
    """What ``middlewares=[...]`` holds: FastStream calls it once per delivery."""

    def __init__(self, semel: Doors) -> None:
        self._semel = semel

    def __call__(self, msg: Any, /, **kwargs: Any) -> SemelMiddleware:
        return SemelMiddleware(msg, context=kwargs["context"], semel=self._semel)


def middleware(semel: Doors) -> _Factory:
    return _Factory(semel)
