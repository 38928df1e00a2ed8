"""The modules one new-key delivery crosses, from the AMQP frame to the ACK.

``python -m bench.path`` starts a consumer in this process (SQLite store, an
async handler that does nothing), publishes one message with a new key, and
records every function of semel's own packages that runs from the moment the
frame reaches the consumer until the ACK is sent, by the task it ran in. The
worker's background tasks (store pings, broker watch) are left out, so what
is printed is the delivery's own path: the modules a reader follows to see
what happens to a message.

``--entry`` names the coroutine that runs the consumer, so the same count can
be taken of an older layout of the code.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

import aio_pika
from dependency_injector import providers

from semel.consumer.broker.topology import queue_specs
from semel.consumer.container import Container
from semel.consumer.plan import topology_of
from semel.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("semel/consumer", "semel/stores")
# Tasks of the worker that run whether or not a delivery is under way.
BACKGROUND = ("_ping_when_quiet", "broker_gone_for", "watch", "wait", "ping_until_up")
AMQP_URL = "amqp://guest:guest@localhost:5672/"
DEADLINE = 30.0


class Recorder:
    """A profile hook: which of semel's modules ran, by the coroutine of their task."""

    def __init__(self) -> None:
        self.by_task: dict[str, set[str]] = defaultdict(set)
        self.acked = asyncio.Event()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if (
            not path.is_relative_to(ROOT)
            or "/".join(path.relative_to(ROOT).parts[:2]) not in PACKAGES
        ):
            return
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        name = task.get_coro().__qualname__ if task is not None else "(loop callback)"  # type: ignore[union-attr]
        self.by_task[name].add(module)
        if frame.f_code.co_name == "ack" and module.endswith("intake"):
            self.acked.set()

    def delivery_path(self) -> set[str]:
        return {
            module
            for task, modules in self.by_task.items()
            if not task.split(".")[-1].startswith(BACKGROUND)
            for module in modules
        }


async def measure(entry: str) -> Recorder:
    module_name, _, function = entry.partition(":")
    consume = getattr(importlib.import_module(module_name), function)
    queue = f"bench.path.{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            store="sqlite",
            sqlite_path=str(Path(tmp) / "path.db"),
            queue=queue,
            exchange=queue,
            handler="bench.handlers:handle",
            metrics_port=0,
            key_prefix="path",
        )
        container = Container()
        container.settings.override(providers.Object(settings))
        stop = asyncio.Event()
        running = asyncio.create_task(consume(container, stop))
        connection = await aio_pika.connect(AMQP_URL)
        try:
            await _until_consumed(connection, queue)
            channel = await connection.channel()
            recorder = Recorder()
            sys.setprofile(recorder)
            try:
                exchange = await channel.get_exchange(queue)
                await exchange.publish(
                    aio_pika.Message(b'{"n": 1}', headers={"Idempotency-Key": "k-1"}), "any"
                )
                await asyncio.wait_for(recorder.acked.wait(), DEADLINE)
            finally:
                sys.setprofile(None)
            stop.set()
            await asyncio.wait_for(running, DEADLINE)
            spec = topology_of(settings)
            for queue_spec in queue_specs(spec):
                await channel.queue_delete(queue_spec.name)
            for name in (queue, spec.names.retry_exchange, spec.names.dead_letter_exchange):
                await channel.exchange_delete(name)
        finally:
            await connection.close()
    return recorder


async def _until_consumed(connection: aio_pika.abc.AbstractConnection, queue: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while loop.time() < deadline:
        try:
            # A passive declare of a queue not declared yet closes its channel: one each time.
            async with connection.channel() as channel:
                declared = await channel.declare_queue(queue, passive=True)
                if declared.declaration_result.consumer_count:
                    return
        except aio_pika.exceptions.ChannelNotFoundEntity:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"nobody consumes {queue}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.path", description=__doc__)
    parser.add_argument("--entry", default="semel.consumer.commands.consume:run_consumer")
    args = parser.parse_args()
    recorder = asyncio.run(measure(args.entry))
    path = sorted(recorder.delivery_path())
    for task, modules in sorted(recorder.by_task.items()):
        print(f"{task}: {', '.join(sorted(modules))}")
    print()
    mine = [m for m in path if m.startswith("semel.consumer")]
    stores = [m for m in path if m.startswith("semel.stores")]
    print(f"delivery path: {len(mine)} consumer modules, {len(stores)} store modules")
    print("  " + "\n  ".join(path))


if __name__ == "__main__":
    main()
