"""A real ``semel consume`` process on its way out closes what it opened, in order."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from semel.consumer.delivery.message import fingerprint
from semel.stores.base import Outcome, Status, Store
from tests.consumer.conftest import ConsumerSettings
from tests.consumer.harness import Broker, ConsumerProcess, TcpProxy, eventually, processes
from tests.consumer.test_delivery import status_is
from tests.consumer.test_faults import through_proxy
from tests.servers import free_port

pytestmark = pytest.mark.timeout(90)

LEASE = 9.0  # a store call's deadline of 3 s; the key must be free well before the lease ends
EXAMPLE = "semel.consumer.examples:order_paid"


# PostgreSQL: psycopg has no timeout of its own, so the call is the deadline
# store's to abandon. (redis-py gives up at its socket timeout, 3 s, and drops
# the connection: a claim it sent may land later with nobody to hear of it.)
@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_claim_abandoned_on_a_stalled_link_is_released_before_the_process_exits(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, tmp_path: Path
) -> None:
    port = free_port()
    target, overrides = through_proxy(consumer_settings(), port)
    proxy = await TcpProxy(target, port).start()
    settings = consumer_settings(**overrides, lock_ttl=LEASE, handler=EXAMPLE)
    await broker.declare(settings)
    try:
        with processes() as started:
            worker = ConsumerProcess(settings, tmp_path / "worker.log").start()
            started.append(worker)
            await broker.publish(settings, {"order_id": "W", "amount": 1}, key="warm")
            await eventually(lambda: status_is(store, "warm", Status.COMPLETED), 20, "warm")

            proxy.delay = 0.3  # a slow link: the late claim's release is out as the close begins
            proxy.stall()
            await broker.publish(settings, {"order_id": "L", "amount": 1}, key="late")

            async def given_up() -> bool:  # the claim abandoned, then a ping too
                return "store unreachable" in worker.output()

            await eventually(given_up, 20, "the worker gave the stalled store up")
            worker.signal(signal.SIGTERM)
            proxy.resume()  # the abandoned claim lands now, while the process closes
            resumed_at = time.monotonic()
            assert await worker.wait(30) == 0, worker.output()

        # Free the moment the process is gone: released, not left to its lease.
        claim = await store.claim("late", fingerprint({"order_id": "L", "amount": 1}))
        assert claim.outcome is Outcome.CLAIMED, (claim, worker.output())
        assert time.monotonic() - resumed_at < LEASE
    finally:
        await proxy.close()
