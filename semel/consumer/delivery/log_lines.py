"""What deliveries add to the log: the delivery's fields on every line its
handler writes, and a periodic line that counts what became of deliveries.

The fields are structlog context variables, so the handler's own structlog
and standard-library lines both carry them (:mod:`semel.consumer.ops.logs` merges
them into each). Each delivery runs in a task of its own and a plain
handler's thread starts from a copy of that task's context
(:func:`semel.consumer.delivery.handler.start_in_thread`), so two deliveries never
see each other's fields.

A line per delivery costs more than recognising a duplicate, so routine
outcomes are logged one by one at debug only; at info, :class:`Summary` says
every few seconds how many deliveries settled, by outcome.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from contextlib import AbstractContextManager
from typing import Any

import structlog

from semel.consumer.delivery.handler import Context

SUMMARY_EVERY = 5.0  # seconds: the longest a settled delivery waits to be counted in a line
SUMMARY_EVENT = "deliveries settled"

log = structlog.get_logger("semel.pipeline")


def _bound_vars() -> tuple[contextvars.ContextVar[Any], ...]:
    """structlog's own context variables of a delivery's fields, in :func:`bound_to`'s
    order: bound once in an empty context, which leaves no value anywhere."""
    tokens = contextvars.Context().run(
        structlog.contextvars.bind_contextvars,
        key=None,
        fence=None,
        attempt=None,
        message_id=None,
        routing_key=None,
    )
    return tuple(token.var for token in tokens.values())


# Set directly on every delivery: what bind_contextvars does, without finding
# each variable by name again.
_KEY, _FENCE, _ATTEMPT, _MESSAGE_ID, _ROUTING_KEY = _bound_vars()


class _Bound:
    """The fields of one delivery, set while entered (a class: cheaper per delivery
    than a generator-based context manager)."""

    __slots__ = ("_context", "_tokens")

    def __init__(self, context: Context) -> None:
        self._context = context
        self._tokens: tuple[contextvars.Token[Any], ...] = ()

    def __enter__(self) -> None:
        context = self._context
        self._tokens = (
            _KEY.set(context.key),
            _FENCE.set(context.fence),
            _ATTEMPT.set(context.attempt),
            _MESSAGE_ID.set(context.message_id),
            _ROUTING_KEY.set(context.routing_key),
        )

    def __exit__(self, *exc: object) -> None:
        key, fence, attempt, message_id, routing_key = self._tokens
        _ROUTING_KEY.reset(routing_key)
        _MESSAGE_ID.reset(message_id)
        _ATTEMPT.reset(attempt)
        _FENCE.reset(fence)
        _KEY.reset(key)


def bound_to(context: Context) -> AbstractContextManager[None]:
    """Bind the delivery's key, fence, attempt, message id and routing key to the
    log lines written while the handler runs; unbound when it ends."""
    return _Bound(context)


class Summary:
    """Counts settled deliveries by outcome; logs the counts at info ``every``
    seconds after the first delivery of a period settles, and nothing while idle.

    Timer-driven, not a task: a delivery pays a dictionary increment.
    """

    def __init__(self, every: float = SUMMARY_EVERY, queue: str = "") -> None:
        self._every = every
        self._queue = queue  # an app's worker has one summary per handler's queue
        self._counts: dict[str, int] = {}
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, outcome: str) -> None:
        counts = self._counts
        counts[outcome] = counts.get(outcome, 0) + 1
        if self._timer is None:
            self._since = time.monotonic()
            # An empty context: the line belongs to no delivery, whichever
            # one happened to start the period.
            self._timer = asyncio.get_running_loop().call_later(
                self._every, self.flush, context=contextvars.Context()
            )

    def flush(self) -> None:
        """Log the counts so far, if any (at a stop: the last period's)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        counts, self._counts = self._counts, {}
        if counts:
            seconds = round(time.monotonic() - self._since, 1)
            where = {"queue": self._queue} if self._queue else {}
            log.info(SUMMARY_EVENT, **counts, total=sum(counts.values()), seconds=seconds, **where)
