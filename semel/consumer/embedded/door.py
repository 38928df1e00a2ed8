"""One queue of somebody else's consumer, run through semel's pipeline.

A front door (the aio-pika scope, the FastStream middleware) hands each
delivery of the queue to :meth:`Door.handle` with the code that processes it.
The pipeline is the worker's own: the key is read and claimed, the code runs
under the renewed lease (a lost lease cancels it), the outcome is recorded
fenced, and the delivery is settled by the same confirmed copies: retry
tiers, the conflict queue, the DLQ. The only route of the queue calls
whatever code the front door passed in, read from a context variable of the
delivery's task, so one pipeline serves every delivery of the queue.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from semel.consumer.broker.delays import DelayReturns
from semel.consumer.broker.settle import Settler
from semel.consumer.delivery.decide import Ack, Applied, Settle
from semel.consumer.delivery.facts import Delivery
from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.observe import Observer
from semel.consumer.delivery.pipeline import Pipeline
from semel.stores.base import Claim

Call = Callable[[Context], Awaitable[Any]]
# Seconds the deliveries cut short at close get to release their claims (as the
# worker gives them).
CUT_SHORT_WAIT = 10.0


@dataclass(slots=True)
class Passage:
    """What one delivery's front door learns on its way through the pipeline."""

    call: Call
    defer_ack: bool = False  # the front door ACKs itself, once it has done its part
    context: Context | None = None  # set when the code is about to run
    claim: Claim | None = None  # the store's answer, the stored result of a duplicate
    pending_ack: Settle | None = None  # the ACK :meth:`Door.finish` sends
    decision: Settle | None = None


_PASSAGE: contextvars.ContextVar[Passage] = contextvars.ContextVar("semel_passage")


def current_passage() -> Passage | None:
    """The passage of the delivery this task is processing, if any."""
    return _PASSAGE.get(None)


async def through(context: Context) -> Any:
    """The route's handler: the front door's code for this delivery."""
    passage = _PASSAGE.get()
    passage.context = context
    return await passage.call(context)


class Witness(Observer):
    """The door's observer: tells ``inner`` everything, and keeps the claim for the
    front door (a duplicate's stored result)."""

    def __init__(self, inner: Observer) -> None:
        self._inner = inner

    def delivery(self, message: Incoming) -> AbstractContextManager[object]:
        return self._inner.delivery(message)

    def claimed(self, claim: Claim, attempt: int) -> None:
        if (passage := _PASSAGE.get(None)) is not None:
            passage.claim = claim
        self._inner.claimed(claim, attempt)

    def overrun(self) -> AbstractContextManager[object]:
        return self._inner.overrun()

    def settled(self, delivery: Delivery, decision: Settle, applied: Applied) -> None:
        self._inner.settled(delivery, decision, applied)

    def admitting(self, limit: int) -> None:
        self._inner.admitting(limit)


class DeferringSettler(Settler):
    """The worker's settler, except that an ACK may wait for the front door: FastStream
    publishes a handler's reply after the middleware's scope, and a delivery ACKed
    before that reply went out would lose it to a crash in between."""

    async def finish(self, message: Incoming, decision: Settle) -> Applied:
        passage = _PASSAGE.get(None)
        if passage is not None and passage.defer_ack and isinstance(decision, Ack):
            passage.pending_ack = decision
            return Applied(decision.outcome, "ack")
        return await super().finish(message, decision)


class Doors(Protocol):
    """What a front door asks its engine for (:class:`semel.consumer.embedded.engine.Semel`)."""

    async def door(self, queue: str | None = None) -> Door:
        """``queue``'s door, opened the first time it is asked for."""

    def opened(self, queue: str) -> Door | None:
        """``queue``'s door if it is open already (no await on every delivery)."""


class Door:
    """One queue's pipeline, the deliveries it is processing, and the consumers of
    its delay queues."""

    def __init__(self, pipeline: Pipeline, settler: DeferringSettler, delays: DelayReturns) -> None:
        self.pipeline = pipeline
        self._settler = settler
        self._delays = delays
        self._tasks: set[asyncio.Task[Settle]] = set()

    def start(self, message: Incoming, passage: Passage) -> asyncio.Task[Settle]:
        """Process and settle ``message`` in a task of semel's own (an ACK left to
        :meth:`finish` if deferred).

        Not in the caller's task: aiormq runs each delivery's callback (and
        FastStream its whole subscriber) in a task it cancels when the channel
        closes, and a broker restart would cut every delivery short in the
        middle of its handler or of its completion's write, running its key
        again elsewhere. The worker has its own task per delivery for the same
        reason. Callers await it shielded; :meth:`close` stops what is left.
        """
        task = asyncio.create_task(self._handle(message, passage))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, message: Incoming, passage: Passage) -> Settle:
        _PASSAGE.set(passage)  # this task's own context
        passage.decision = await self.pipeline.handle(message)
        return passage.decision

    async def finish(self, message: Incoming, passage: Passage, *, ack: bool) -> None:
        """Send the ACK the pipeline left to the front door, or hand the message back
        (``ack=False``: what the door did after the handler failed)."""
        pending, passage.pending_ack = passage.pending_ack, None
        if pending is None:
            return
        if ack:
            await Settler.finish(self._settler, message, pending)
        else:
            await self._settler.give_back(message)

    async def close(self, grace: float) -> None:
        """Let the deliveries in flight finish for ``grace`` seconds, cut the rest
        short (their claims released, their messages handed back), as the worker
        stops; then stop returning delayed messages."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        running = {t for t in self._tasks if not self.pipeline.concluding(t)}
        for task in running:
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CUT_SHORT_WAIT)
        await self._delays.stop()
