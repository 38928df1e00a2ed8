"""``async with semel.process(message) as run:``, for an aio-pika consumer callback.

The block is the handler. Entering claims the key; if the delivery is a
duplicate, in progress elsewhere, a bad message or anything else that must not
run, semel has already settled it and ``run.skipped`` is true: the block
returns at once. Otherwise the block runs under the claim's lease, renewed; a
lost lease or the time limit cancels the block (as ``asyncio.timeout`` would)
and the block's end records and settles the delivery exactly as the worker
would: completed and ACKed, a retry copy, the DLQ. The exception the block
raised is recorded and settled, not re-raised; a cancellation from outside
(the application stopping) cuts the delivery short and goes on.

The pipeline runs in a task of its own and calls the block through a bridge:
the bridge returns when the block ends, so the lease, the time limit and the
recording are the worker's own code.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from semel.consumer.delivery.decide import Settle
from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.message import Incoming
from semel.consumer.embedded.door import Door, Doors, Passage


@dataclass(slots=True)
class Run:
    """One delivery inside ``semel.process``: what the block needs, and what became of it."""

    context: Context | None = None
    result: Any = None  # what the block sets is stored as the key's result
    decision: Settle | None = field(default=None, repr=False)

    @property
    def skipped(self) -> bool:
        """Settled without running the block (a duplicate, in progress, bad input)."""
        return self.context is None

    @property
    def key(self) -> str:
        return self._context().key

    @property
    def fence(self) -> int:
        return self._context().fence

    @property
    def attempt(self) -> int:
        return self._context().attempt

    @property
    def body(self) -> dict[str, Any]:
        return self._context().body

    @property
    def outcome(self) -> str | None:
        """What was done with the delivery (``completed``, ``duplicate``, ``retry``...),
        once the block has ended."""
        return None if self.decision is None else self.decision.outcome.value

    def _context(self) -> Context:
        if self.context is None:
            raise RuntimeError("the delivery was settled without running: see run.skipped")
        return self.context


class Scope:
    """The context manager :meth:`Semel.process` returns."""

    def __init__(self, semel: Doors, message: Incoming, queue: str | None) -> None:
        self._semel = semel
        self._message = message
        self._queue = queue
        self._run = Run()
        self._started: asyncio.Future[Context] | None = None
        self._ended: asyncio.Future[Any] | None = None
        self._task: asyncio.Task[Settle] | None = None
        self._owner: asyncio.Task[Any] | None = None
        self._cancelled_by_us = False

    async def __aenter__(self) -> Run:
        door: Door = await self._semel.door(self._queue)
        loop = asyncio.get_running_loop()
        self._owner = asyncio.current_task()
        self._started = loop.create_future()
        self._ended = loop.create_future()
        self._task = door.start(self._message, Passage(self._bridge))
        waits: set[asyncio.Future[Any]] = {self._started, self._task}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # stopped before the block began: cut it short
            self._ended.cancel()  # as in __aexit__: the bridge must not cancel us back
            self._task.cancel()
            raise
        if self._started.done():
            self._run.context = self._started.result()
        else:  # settled without running the block
            self._run.decision = self._task.result()
        return self._run

    async def _bridge(self, context: Context) -> Any:
        """The route's handler: runs while the block does, in the pipeline's task."""
        assert self._started is not None
        assert self._ended is not None
        self._started.set_result(context)
        try:
            return await asyncio.shield(self._ended)
        except asyncio.CancelledError:
            # The lease was lost or the time limit passed (the pipeline's task
            # was cancelled): the block is cancelled too, as a timeout would.
            if not self._ended.done() and self._owner is not None:
                self._cancelled_by_us = True
                self._owner.cancel()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task, ended = self._task, self._ended
        if task is None or ended is None or self._run.skipped:
            return False
        if isinstance(exc, asyncio.CancelledError):
            if self._cancelled_by_us and self._owner is not None and self._owner.uncancel() == 0:
                # Ours alone: the pipeline records why (lease lost, time limit).
                self._run.decision = await asyncio.shield(task)
                return True
            # The application is stopping: the claim is released, the message handed back.
            # ``ended`` cancelled first, so the bridge does not take the pipeline's
            # cancellation for its own and cancel this task back, which would cut
            # the release and the hand-back short.
            ended.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return False
        if self._cancelled_by_us and self._owner is not None:
            self._owner.uncancel()  # the block swallowed our cancellation
        if not ended.done():
            if exc is None:
                ended.set_result(self._run.result)
            else:
                ended.set_exception(exc)
        # Shielded: the block has ended, and a cancellation of this task now
        # (aiormq's, when the channel closes) must not cut the completion's
        # write short; the delivery's settling goes on in semel's task.
        self._run.decision = await asyncio.shield(task)
        self._task = None  # its coroutine holds the bridge, which holds this scope
        return exc is None or isinstance(exc, Exception)
