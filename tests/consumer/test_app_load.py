"""Why every handler of an app gets a queue of its own: under load, a slow handler's
backlog never holds up a fast one. Shown both ways on the real broker with the
same two handlers: on queues of their own, every fast delivery completes while
all the slow ones are still blocked; sharing one queue (one consumer, one
prefetch), the slow deliveries fill the prefetch and not one fast delivery
completes until they are let go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from semel.consumer.plan import plans_for
from tests.consumer import app_handlers
from tests.consumer.app_handlers import SLOW_PREFETCH, load, shared
from tests.consumer.conftest import ConsumerSettings
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_app import app_consumer

pytestmark = [pytest.mark.parametrize("backend", ["redis"]), pytest.mark.timeout(120)]

SLOW = 40
FAST = 1000


@pytest.fixture(autouse=True)
def blocked() -> Iterator[None]:
    app_handlers.release.clear()
    yield
    app_handlers.release.set()  # nothing stays blocked past the test


def counted(ledger: Path, prefix: str) -> int:
    return sum(1 for entry in read_ledger(ledger) if entry["event"].startswith(prefix + " "))


async def publish_backlog(broker: Broker, exchange_name: str, fast: int) -> None:
    """The slow handler's messages first, then the fast one's, all confirmed."""
    exchange = await broker.channel.get_exchange(exchange_name, ensure=False)

    async def one(routing_key: str, n: int) -> None:
        message = aio_pika.Message(b"{}", headers={"Idempotency-Key": f"{routing_key}-{n}"})
        await exchange.publish(message, routing_key=routing_key, mandatory=True)

    await asyncio.gather(*(one("load.slow", n) for n in range(SLOW)))
    await asyncio.gather(*(one("load.fast", n) for n in range(fast)))


async def test_on_queues_of_their_own_a_slow_handler_does_not_hold_up_a_fast_one(
    consumer_settings: ConsumerSettings, broker: Broker, ledger: Path
) -> None:
    settings = consumer_settings(handler="tests.consumer.app_handlers:load", lock_ttl=30.0)
    plans = plans_for(load, settings)
    async with app_consumer(settings, broker, plans):
        await publish_backlog(broker, settings.exchange, FAST)
        await eventually(
            lambda: _at_least(ledger, "fast", FAST), 90, f"{FAST} fast deliveries completed"
        )
        # Every slow delivery was still blocked meanwhile: its prefetch's worth started.
        assert counted(ledger, "slow") == 0
        assert counted(ledger, "slow-start") == SLOW_PREFETCH
        app_handlers.release.set()
        await eventually(lambda: _at_least(ledger, "slow", SLOW), 60, "the slow ones completed")
    assert counted(ledger, "fast") == FAST  # once each


async def test_sharing_one_queue_the_slow_handler_holds_up_the_fast_one(
    consumer_settings: ConsumerSettings, broker: Broker, ledger: Path
) -> None:
    settings = consumer_settings(handler="tests.consumer.app_handlers:shared", lock_ttl=30.0)
    plans = plans_for(shared, settings)
    assert len(plans) == 1
    async with app_consumer(settings, broker, plans):
        await publish_backlog(broker, settings.exchange, 50)
        await eventually(
            lambda: _at_least(ledger, "slow-start", SLOW_PREFETCH), 30, "the prefetch filled"
        )
        # Held up: for as long as the slow ones block, no fast one is even delivered.
        # (A fixed look, not a wait for an event: what is shown is that none happens.)
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            assert counted(ledger, "fast") == 0
            await asyncio.sleep(0.1)
        app_handlers.release.set()
        await eventually(lambda: _at_least(ledger, "fast", 50), 60, "the fast ones completed")
        await eventually(lambda: _at_least(ledger, "slow", SLOW), 60, "the slow ones completed")


async def _at_least(ledger: Path, prefix: str, count: int) -> bool:
    return counted(ledger, prefix) >= count
