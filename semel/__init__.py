"""semel: run a RabbitMQ handler effectively once per idempotency key.

The packages live under this one name so that a service's own top-level
``settings``, ``stores`` or ``consumer`` never shadows them, nor they it:
``semel.consumer`` (handlers import ``Context`` and ``PermanentError`` from it),
``semel.stores`` and ``semel.settings``.

For code that consumes or calls on its own (a FastStream app, an aio-pika
callback, a web endpoint), ``from semel import Semel``: the engine those front
doors share (see ``semel.consumer.embedded``); to produce, ``Publisher`` (or
``SyncPublisher``) publishes the way semel's consumer reads; ``tune_gc()``, called
once such an app has started, sets Python's garbage collector for hundreds of
deliveries in flight, as ``semel consume`` does for itself. The names below are imported on
first use, so ``import semel`` stays cheap for a worker or a command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semel.consumer import Context, PermanentError
    from semel.consumer.embedded import Semel, current
    from semel.consumer.embedded.publishing import Publisher, SyncPublisher
    from semel.consumer.ops.collector import tune_gc
    from semel.consumer.producer import Answer, Message, Receipt, Retry
    from semel.settings import Settings

_PUBLIC = {
    "Semel": "semel.consumer.embedded",
    "current": "semel.consumer.embedded",
    "Context": "semel.consumer",
    "PermanentError": "semel.consumer",
    "Settings": "semel.settings",
    "Publisher": "semel.consumer.embedded.publishing",
    "SyncPublisher": "semel.consumer.embedded.publishing",
    "Answer": "semel.consumer.producer",
    "Message": "semel.consumer.producer",
    "Receipt": "semel.consumer.producer",
    "Retry": "semel.consumer.producer",
    "tune_gc": "semel.consumer.ops.collector",
}

__all__ = [
    "Answer",
    "Context",
    "Message",
    "PermanentError",
    "Publisher",
    "Receipt",
    "Retry",
    "Semel",
    "Settings",
    "SyncPublisher",
    "current",
    "tune_gc",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'semel' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
