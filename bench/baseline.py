"""The baseline: a bare aio-pika consumer that ACKs every message and does nothing else.

``python -m bench.baseline`` with ``BENCH_AMQP_URL`` and ``BENCH_QUEUE`` (and
optionally ``BENCH_PREFETCH``, ``BENCH_PROBE_FILE``). It runs as a
child process like semel, so both pay the same for process and broker
scheduling; it stops cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.probes import SENT_HEADER, ProbeLog

DEFAULT_PREFETCH = 256


async def consume(url: str, queue_name: str, prefetch: int) -> None:
    probes = ProbeLog.from_env()
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(queue_name, ensure=False)

    async def on_message(message: AbstractIncomingMessage) -> None:
        sent = message.headers.get(SENT_HEADER)
        if not isinstance(sent, int):
            await message.ack()
            return
        delivered = time.monotonic_ns()
        await message.ack()
        probes.write(delivered - sent, time.monotonic_ns() - delivered)

    await queue.consume(on_message)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await connection.close()


def main() -> None:
    prefetch = int(os.environ.get("BENCH_PREFETCH", DEFAULT_PREFETCH))
    asyncio.run(consume(os.environ["BENCH_AMQP_URL"], os.environ["BENCH_QUEUE"], prefetch))


if __name__ == "__main__":
    main()
