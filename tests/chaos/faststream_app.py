"""A chaos worker behind the FastStream front door: ``python -m tests.chaos.faststream_app``.

The same environment as ``python -m semel`` (the ``SEMEL_*`` settings and
``SEMEL_CHAOS_LEDGER``): :class:`Semel` reads it, and a FastStream app with
semel's middleware subscribes to ``SEMEL_QUEUE``. The subscriber is the
ledger handler (:func:`tests.chaos.ledger.handle`), given semel's context
through FastStream's ``Context("semel")``, so an execution leaves the same
ledger row with the same key, fence and attempt as under the worker.

The run has already declared semel's whole topology, the work queue with its
quorum and dead-letter arguments included: FastStream only looks the queue up
(``declare=False``), since declaring it again with other arguments would be
refused. Its prefetch is ``SEMEL_PREFETCH``, as the worker's is, and every
delivery runs in a task of its own up to it.

Logs are semel's JSON lines on stderr (:func:`semel.consumer.ops.logs.configure`
with ``SEMEL_LOG_FORMAT`` and ``SEMEL_LOG_LEVEL``), so the pipeline's
``settled`` lines the verdict reads are written as the worker writes them;
FastStream's own lines go through the same renderer. SIGTERM stops the app
(FastStream's signal handling): the subscriber stops consuming, deliveries in
flight get ``SEMEL_SHUTDOWN_GRACE`` to end, and then semel is closed. A store
or broker that cannot be reached at start-up ends the process with one error
line and exit code 1, as it ends the worker: the run restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog
from aiormq.exceptions import AMQPError
from faststream import Context as FromContext
from faststream import FastStream
from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

from semel.consumer import Context
from semel.consumer.container import log_setup
from semel.consumer.embedded import Semel
from semel.consumer.ops.logs import configure
from semel.stores.errors import EXIT_FAILURE, SemelError
from tests.chaos.ledger import handle

LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = None
try:  # the worker runs on uvloop where it is installed: so does this one
    import uvloop

    LOOP_FACTORY = uvloop.new_event_loop
except ImportError:
    pass

SEMEL_CONTEXT = FromContext("semel")
# FastStream's lines, through semel's renderer. Its per-delivery "Received" and
# "Processed" lines say less than semel's own settled line: warnings and up only.
FASTSTREAM_LOGGER = "semel.chaos.faststream"

log = structlog.get_logger("semel.chaos.faststream_app")


def build(semel: Semel) -> FastStream:
    """The app: one subscriber on the work queue, semel's middleware on the broker."""
    settings = semel.settings
    logger = logging.getLogger(FASTSTREAM_LOGGER)
    logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    broker = RabbitBroker(
        settings.amqp_url,
        middlewares=[semel.faststream()],
        default_channel=Channel(prefetch_count=settings.prefetch),
        graceful_timeout=settings.shutdown_grace,
        logger=logger,
    )

    @broker.subscriber(RabbitQueue(settings.queue, declare=False))
    async def work(context: Context = SEMEL_CONTEXT) -> Any:
        return await handle(context)

    async def open_semel() -> None:
        # The store opened and the queue's retry tiers, conflict queue and DLQ
        # consumers started before the first delivery, as the worker does.
        await semel.start()
        await semel.door(settings.queue)

    return FastStream(broker, logger=logger, on_startup=[open_semel])


async def serve(semel: Semel) -> None:
    app = build(semel)
    try:
        await app.run()
    finally:
        # After the broker stopped (or failed to start): nothing uses semel any more.
        await semel.close()


def main() -> int:
    semel = Semel()  # the SEMEL_* environment, as the worker reads it
    configure(log_setup(semel.settings))
    try:
        with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
            runner.run(serve(semel))
    except SemelError as exc:
        log.error("start-up failed", error=str(exc) or type(exc).__name__)
        return exc.exit_code
    except (AMQPError, OSError) as exc:  # FastStream's first connection: the broker away
        log.error("start-up failed", error=repr(exc))
        return EXIT_FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main())
