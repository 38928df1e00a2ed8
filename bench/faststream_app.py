"""A FastStream app on the case's queue: bare, or with semel's middleware in front of it.

``python -m bench.faststream_app`` with ``BENCH_AMQP_URL``, ``BENCH_QUEUE`` and
``BENCH_PREFETCH``; with ``BENCH_MIDDLEWARE=semel`` the broker gets
``semel.faststream()``, and :class:`Semel` reads its settings from the
``SEMEL_*`` variables the worker of the same case gets (store, key prefix,
prefetch...). It runs as a child process like the other consumers and stops
cleanly on SIGTERM.

Concurrency: FastStream's RabbitMQ subscriber (0.7) has no ``max_workers``;
aiormq starts a task for every delivery, so the deliveries in flight are
bounded by the channel's QoS alone, and FastStream sets none unless asked
(``Channel(prefetch_count=...)``): unbounded. The app asks for the same
prefetch as the worker, so both run up to that many deliveries at once.

With ``BENCH_PROFILE=<file>`` the app profiles itself with cProfile from the
moment it consumes until SIGTERM (start-up and imports left out) and writes
the statistics to that file, and the time the cyclic garbage collector took
meanwhile, per generation, to ``<file>.gc.json`` (cProfile counts a
collection to whichever function allocated when it started);
``python -m bench.profiles`` reads both.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

from bench.baseline import DEFAULT_PREFETCH
from bench.children import MIDDLEWARE_ENV, PROFILE_ENV, SEMEL_MIDDLEWARE
from semel.consumer.embedded import Semel
from semel.consumer.ops.collector import tune_gc

LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = None
with contextlib.suppress(ImportError):
    import uvloop

    # What `faststream run` picks where it is installed; semel's worker runs on it too.
    LOOP_FACTORY = uvloop.new_event_loop


async def handle(body: dict[str, Any]) -> None:
    """No work, like bench.handlers.handle: what is measured is the consumer around it.

    The body is declared as an application would, so FastStream decodes and
    validates it for every message, with or without semel.
    """


@contextlib.contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """cProfile and the garbage collector's pauses while the block runs, if ``path``."""
    if path is None:
        yield
        return
    profiler = cProfile.Profile()
    pauses = {str(generation): [0, 0.0] for generation in range(3)}  # collections, seconds
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pause = pauses[str(info["generation"])]
            pause[0] += 1
            pause[1] += time.perf_counter() - began[0]

    gc.callbacks.append(timed)
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        gc.callbacks.remove(timed)
        profiler.dump_stats(path)
        Path(f"{path}.gc.json").write_bytes(orjson.dumps(pauses))


@contextlib.asynccontextmanager
async def semel_or_not(middleware: str | None) -> AsyncIterator[Semel | None]:
    if middleware is None:
        yield None
        return
    if middleware != SEMEL_MIDDLEWARE:
        raise SystemExit(f"{MIDDLEWARE_ENV}={middleware!r}: only {SEMEL_MIDDLEWARE!r} is known")
    async with Semel() as semel:  # settings from SEMEL_*, as the worker's
        yield semel


async def consume(
    url: str, queue: str, prefetch: int, middleware: str | None, profile: str | None = None
) -> None:
    async with semel_or_not(middleware) as semel:
        broker = RabbitBroker(
            url,
            default_channel=Channel(prefetch_count=prefetch),
            middlewares=[] if semel is None else [semel.faststream()],
            # Its two access lines per message go down to debug, below the logger's
            # level: semel's worker writes no line per message at info either.
            log_level=logging.DEBUG,
        )
        # The case declared the queue (semel's topology): passive here.
        broker.subscriber(RabbitQueue(queue, declare=False))(handle)
        if semel is not None:
            # Its delay queues, DLQ and returners now, not at the first (timed) delivery.
            await semel.door(queue)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with broker:
            await broker.start()
            # As docs/faststream.md advises an app with the middleware; the bare
            # app too, so that the two differ by the middleware alone.
            tune_gc()
            with profiled(profile):
                await stop.wait()


def main() -> None:
    prefetch = int(os.environ.get("BENCH_PREFETCH", DEFAULT_PREFETCH))
    middleware = os.environ.get(MIDDLEWARE_ENV) or None
    profile = os.environ.get(PROFILE_ENV) or None
    url, queue = os.environ["BENCH_AMQP_URL"], os.environ["BENCH_QUEUE"]
    work = consume(url, queue, prefetch, middleware, profile)
    with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
        runner.run(work)


if __name__ == "__main__":
    main()
