"""Handlers of the transactional process tests, and the kill points they arm.

A consumer process started with ``SEMEL_TEST_KILL_AT=<point>`` (and
``SEMEL_TEST_ALLOW_DIE=1``) sends itself SIGKILL the ``SEMEL_TEST_KILL_AFTER``-th
time (default: the first) it reaches ``<point>``:

- ``before-handler``: the key is claimed and its transaction open, nothing written;
- ``in-handler``: the business row is written and the message staged, not committed;
- ``after-commit``: the unit committed; the delivery is not acked yet;
- ``before-relay``: committed (and, on the fast path, acked); the relay has
  taken the rows but not published them;
- ``after-publish``: the broker confirmed the messages; the relay has not yet
  committed them as sent, so they go out again, under the same id.

The first two are calls in the handlers below. The other three lie in the
product's own path; this module wraps them when it is imported, which the
consumer does because it is the ``SEMEL_HANDLER``, and only when a kill point
is armed. The product itself carries no test hooks.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg import sql

from semel.consumer import PermanentError
from semel.consumer.outbox.relay import Relay
from semel.consumer.transactional import TransactionalContext
from semel.stores.base import JSON
from semel.stores.postgres.transactional import TransactionalStore
from tests.consumer.handlers import ALLOW_DIE_ENV

KILL_AT_ENV = "SEMEL_TEST_KILL_AT"
KILL_AFTER_ENV = "SEMEL_TEST_KILL_AFTER"
KILL_POINTS = ("before-handler", "in-handler", "after-commit", "before-relay", "after-publish")
ROUTING_KEY = "order.recorded"

P = ParamSpec("P")
T = TypeVar("T")
_reached: Counter[str] = Counter()


def reached(point: str) -> None:
    """SIGKILL this process if ``point`` is the armed kill point and its turn has come."""
    if os.environ.get(KILL_AT_ENV) != point:
        return
    if os.environ.get(ALLOW_DIE_ENV) != "1":
        raise RuntimeError("refusing to kill the test process")
    _reached[point] += 1
    if _reached[point] >= int(os.environ.get(KILL_AFTER_ENV, "1")):
        os.kill(os.getpid(), signal.SIGKILL)


def _around(
    call: Callable[P, Coroutine[Any, Any, T]], before: str | None = None, after: str | None = None
) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(call)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        if before:
            reached(before)
        result = await call(*args, **kwargs)
        if after:
            reached(after)
        return result

    return wrapped


def _arm() -> None:
    point = os.environ.get(KILL_AT_ENV)
    if point == "after-commit":
        # run_unit returns once the transaction committed; the pipeline acks after.
        TransactionalStore.run_unit = _around(TransactionalStore.run_unit, after=point)  # type: ignore[method-assign]
    elif point == "before-relay":
        Relay._publish = _around(Relay._publish, before=point)  # type: ignore[method-assign]
    elif point == "after-publish":
        Relay._publish = _around(Relay._publish, after=point)  # type: ignore[method-assign]


_arm()


async def _insert(conn: psycopg.AsyncConnection[Any], table: str, key: str, fence: int) -> None:
    statement = sql.SQL("INSERT INTO {} (key, fence) VALUES (%s, %s)")
    await conn.execute(statement.format(sql.Identifier(table)), (key, fence))


async def record_order(context: TransactionalContext) -> JSON:
    """One business row and one outgoing message per key, in the delivery's transaction.

    Body fields: ``table``, ``exchange``, and optionally ``sleep`` seconds,
    ``fail_until`` attempt and ``permanent``, which fail the run after its writes.
    """
    reached("before-handler")
    body = context.body
    await _insert(context.db, body["table"], context.key, context.fence)
    context.publish(body["exchange"], ROUTING_KEY, {"key": context.key})
    await asyncio.sleep(float(body.get("sleep", 0)))
    reached("in-handler")
    if body.get("permanent"):
        raise PermanentError(str(body["permanent"]))
    if context.attempt <= int(body.get("fail_until", 0)):
        raise RuntimeError(f"transient failure on attempt {context.attempt}")
    return {"recorded": context.key}


def plain(context: TransactionalContext) -> JSON:
    """A plain function: transactional mode refuses it at start-up."""
    return None


async def record_order_priced(context: TransactionalContext) -> Any:
    """:func:`record_order`, returning a ``Decimal`` and a ``datetime``: not JSON as they are."""
    await record_order(context)
    at = datetime(2026, 1, 2, tzinfo=UTC)
    return {"recorded": context.key, "total": Decimal("9.99"), "at": at}


async def record_order_outside(context: TransactionalContext) -> JSON:
    """The same, but the business row is written on a connection of its own: what a
    handler that ignores ``context.db`` does, and what the proof must catch."""
    reached("before-handler")
    body = context.body
    dsn = os.environ["SEMEL_POSTGRES_DSN"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _insert(conn, body["table"], context.key, context.fence)
    context.publish(body["exchange"], ROUTING_KEY, {"key": context.key})
    await asyncio.sleep(float(body.get("sleep", 0)))
    reached("in-handler")
    return {"recorded": context.key}
