"""A testing kit for handlers: what semel would do with a message, without a broker.

:class:`HandlerKit` sends messages through the worker's own pipeline (key,
claim, handler, completion, retry and dead-letter decisions, typed-body
validation) on an in-memory SQLite store, and answers each with a
:class:`Verdict`. Only the broker's edge is replaced: the worker's
:class:`~semel.consumer.broker.settle.Settler` publishes its copies to an
in-process exchange that confirms at once, and the delivery records its ack
or nack. So a verdict is the worker's decision, and a copy's headers are the
ones it would publish::

    async with HandlerKit(order_paid, key_source="body:order_id") as kit:
        verdict = await kit.send({"order_id": "o-1", "amount": 5})
        assert verdict.acked and verdict.stored == {"charged": 5}

Settings come from the environment as for ``semel consume``, keyword
arguments over them (``max_attempts=3``, ``retry_delays=[1, 5]``); the store
settings are ignored. :func:`context` builds a handler's context for a plain
unit test; :class:`SyncHandlerKit` runs the kit from synchronous tests.
"""

from semel.consumer.testing.kit import HandlerKit, SyncHandlerKit
from semel.consumer.testing.verdicts import Published, Verdict, context

__all__ = ["HandlerKit", "Published", "SyncHandlerKit", "Verdict", "context"]
