"""Apps the app tests run, as ``tests.consumer.app_handlers:<name>``.

``orders`` is a service of three handlers: ``charge`` (``async def``, a typed
body) and ``audit`` both take ``orders.paid`` (a fan-out: the same event and
key reach both), ``notify`` (a plain ``def``, its own attempts and retry tier)
takes shipments and resends. ``load`` and ``shared`` pair a fast handler with
a slow one, on queues of their own and on one shared queue. Every run is
appended to the ledger (see :mod:`tests.consumer.handlers`) as
``<handler> <key>``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pydantic import BaseModel

from semel.consumer import App, Context
from tests.consumer.handlers import record

orders = App()


class OrderPaid(BaseModel):
    order_id: str
    amount: int


@orders.handler("orders.paid")
async def charge(order: OrderPaid, context: Context) -> dict[str, Any]:
    record(context, f"charge {context.key}")
    return {"charged": order.amount}


@orders.handler("orders.paid")
async def audit(context: Context) -> None:
    record(context, f"audit {context.key}")


# Set by a test: the mail server is back, and `notify` no longer fails.
mail_server_up = threading.Event()


@orders.handler("orders.*.shipped", "orders.resent", max_attempts=2, retry_delays=[0.2])
def notify(context: Context) -> dict[str, str]:
    record(context, f"notify {context.key}")
    if context.body.get("fail") and not mail_server_up.is_set():
        raise RuntimeError("the mail server said no")
    return {"notified": context.routing_key}


# -- a fast handler beside a slow one ------------------------------------------

SLOW_PREFETCH = 4
# Set by the test: until then every slow handler waits (a thread-safe flag, as
# the handlers run on the consumer's event loop, in the test's process).
release = threading.Event()


async def _slow(context: Context) -> None:
    record(context, f"slow-start {context.key}")
    # Polled: the test sets it from its own code, and an asyncio.Event made at
    # import would not belong to the test's event loop.
    while not release.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    record(context, f"slow {context.key}")


async def _fast(context: Context) -> None:
    record(context, f"fast {context.key}")


load = App()  # each handler on its own queue
load.handler("load.slow", name="slow", prefetch=SLOW_PREFETCH, time_limit=120)(_slow)
load.handler("load.fast", name="fast")(_fast)

shared = App()  # both on one queue, as one consumer with one prefetch
shared.handler("load.slow", name="slow", queue="all", prefetch=SLOW_PREFETCH, time_limit=120)(_slow)
shared.handler("load.fast", name="fast", queue="all", prefetch=SLOW_PREFETCH)(_fast)
