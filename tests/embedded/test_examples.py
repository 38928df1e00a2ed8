"""The front doors' examples, run as a user runs them: their own process, settings
from the environment, the real broker and store, stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import orjson
import pytest

from semel.consumer.names import H_REASON
from semel.settings import Settings
from tests.conftest import settings_env
from tests.consumer.harness import Broker, eventually
from tests.servers import ROOT

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.parametrize("backend", ["redis"], indirect=True),
]


@pytest.mark.parametrize("example", ["faststream_service.py", "aio_pika_consumer.py"])
async def test_the_example_runs_each_order_once(
    example: str, settings: Settings, broker: Broker, tmp_path: Path
) -> None:
    log = tmp_path / "example.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: ASYNC220 - started once, then polled
            [sys.executable, str(ROOT / "examples" / example)],
            cwd=tmp_path,  # outside the checkout, as a service of its own
            env=settings_env(settings) | {"PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        await eventually(lambda: consumed(broker, settings.queue), 30, "the example consuming")
        channel = await broker.connection.channel(publisher_confirms=True)
        for order, key, amount in [("o-1", "k-1", 5), ("o-1", "k-1", 5), ("o-2", "k-2", 0)]:
            body = orjson.dumps({"order_id": order, "amount": amount})
            message = aio_pika.Message(
                body, headers={"Idempotency-Key": key}, content_type="application/json"
            )
            await channel.default_exchange.publish(message, routing_key=settings.queue)
        dlq = f"{settings.queue}.dlq"

        async def done() -> bool:
            return await broker.depth(dlq) == 1 and await broker.depth(settings.queue) == 0

        await eventually(done, 30, "the orders settled")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    text = log.read_text()
    assert text.count("charged order o-1") == 1, text  # the copy never ran
    assert "charged order o-2" not in text
    (letter,) = await broker.dead_letters(settings)
    assert letter.headers[H_REASON] == "permanent-error"
    assert "Traceback" not in text, text


async def consumed(broker: Broker, queue: str) -> bool:
    """The example consumes its queue, and semel's queues beside it are declared:
    their delay consumers run (the DLQ is looked at next)."""
    conflict = f"{queue}.retry.conflict"
    return await broker.consumers(queue) > 0 and await broker.consumers(conflict) > 0
