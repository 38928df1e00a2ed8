"""When the broker's confirm of each relayed message reached the relay.

The relay publishes every row through :func:`publish_confirmed`, which
returns once the broker answered. :func:`record_confirms` wraps that one
function, wherever a semel module bound it, so that each confirmed message
adds ``<message id> <CLOCK_MONOTONIC ns>`` to a file. Nothing else in the
relay changes: the line is written after the answer, before the row is
marked sent.
"""

from __future__ import annotations

import sys
import time
from typing import IO

import aio_pika
from aio_pika.abc import AbstractExchange

from semel.consumer.broker import publishing
from semel.consumer.broker.publishing import Published

_original = publishing.publish_confirmed
_file: IO[str] | None = None


async def _timed(
    exchange: AbstractExchange, message: aio_pika.Message, routing_key: str
) -> Published:
    answer = await _original(exchange, message, routing_key)
    if answer is Published.CONFIRMED and _file is not None:
        _file.write(f"{message.message_id} {time.monotonic_ns()}\n")
    return answer


def record_confirms(path: str) -> int:
    """Record confirms into ``path`` from now on; returns how many bindings were wrapped
    (0: the relay no longer publishes through :func:`publish_confirmed`)."""
    global _file
    _file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    wrapped = 0
    # The module's own name, for modules that import it later, and every copy a
    # semel module already took with ``from ... import publish_confirmed``.
    for name, module in list(sys.modules.items()):
        if name.startswith("semel") and getattr(module, "publish_confirmed", None) is _original:
            module.publish_confirmed = _timed  # type: ignore[attr-defined]
            wrapped += name != publishing.__name__
    return wrapped
