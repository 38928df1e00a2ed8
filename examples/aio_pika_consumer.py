"""An aio-pika consumer of the application's own, with semel's scope around each
delivery (docs/aio-pika.md). ``tests/embedded/test_examples.py`` runs it."""

from __future__ import annotations

# --8<-- [start:consumer]
import asyncio
import logging
import signal

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from semel import PermanentError, Semel

log = logging.getLogger("orders")


async def main() -> None:
    async with Semel() as engine:  # SEMEL_* from the environment
        settings = engine.settings
        await engine.door(settings.queue)  # retry tiers, conflict queue and DLQ beside it
        connection = await aio_pika.connect_robust(settings.amqp_url)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=32)
        queue = await channel.declare_queue(settings.queue, durable=True)

        async def on_message(message: AbstractIncomingMessage) -> None:
            async with engine.process(message) as run:
                if run.skipped:  # a duplicate, in progress elsewhere, bad input: settled
                    return
                if run.body.get("amount", 0) <= 0:
                    raise PermanentError("nothing to charge")  # to the DLQ
                log.info("charged order %s (key %s)", run.body["order_id"], run.key)
                run.result = {"charged": run.body["order_id"]}  # stored with the key
            # Leaving the block settled the delivery: ACKed, retried or dead-lettered.

        await queue.consume(on_message)
        await stopped()
        await connection.close()


async def stopped() -> None:
    """Until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
# --8<-- [end:consumer]
