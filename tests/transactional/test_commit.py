"""A unit whose COMMIT lands while its handler's time limit cuts it short
(the server committed; its answer came too late) is a completed delivery:
never retried, never dead-lettered (real PostgreSQL behind a TCP proxy)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from psycopg import AsyncConnection

from semel.stores.base import Status, Store
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import Broker, InProcessConsumer, eventually
from tests.consumer.test_delivery import finished, settle_all, status_is
from tests.proxy import TcpProxy
from tests.servers import free_port
from tests.transactional.conftest import Downstream, rows

pytestmark = pytest.mark.timeout(60)

# PostgreSQL's answer to COMMIT: CommandComplete, tag "COMMIT". Only the
# server sends it; the client's COMMIT is a Query message ('Q').
COMMIT_ANSWER = b"C\x00\x00\x00\x0bCOMMIT\x00"


class SlowCommitAnswers(TcpProxy):
    """Forwards to PostgreSQL, holding each chunk that answers a COMMIT for ``hold``
    seconds: the commit has landed on the server, its client learns it late (a
    synchronous standby slow to confirm looks the same)."""

    def __init__(self, target_port: int, listen_port: int, hold: float) -> None:
        super().__init__(target_port, listen_port)
        self.hold = hold
        self.held = 0

    async def _forward(
        self, held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        delayed: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def hold_commits() -> None:
            while True:
                due, data = await held.get()
                if COMMIT_ANSWER in data:
                    self.held += 1
                    due = time.monotonic() + self.hold
                await delayed.put((due, data))
                if not data:
                    return

        holding = asyncio.create_task(hold_commits())
        try:
            await super()._forward(delayed, writer)
        finally:
            holding.cancel()


# 1: the last attempt, which would be dead-lettered; 3: one that would be retried.
@pytest.mark.parametrize("max_attempts", [1, 3])
async def test_a_commit_answered_after_the_time_limit_is_a_completed_delivery(
    max_attempts: int,
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    downstream: Downstream,
    db: AsyncConnection[Any],
    business_table: str,
) -> None:
    proxy = SlowCommitAnswers(5432, free_port(), hold=2.0)
    await proxy.start()
    try:
        direct = consumer_settings_tx()
        # A time limit the COMMIT's answer outlasts.
        settings = consumer_settings_tx(
            postgres_dsn=f"postgresql://127.0.0.1:{proxy.port}/test",
            handler_timeout=0.5,
            max_attempts=max_attempts,
        )
        store: Store = await open_store(direct)
        try:
            consumer = await InProcessConsumer(settings).start(broker, settings)
            body = {"table": business_table, "exchange": downstream.exchange}
            await broker.publish(settings, body, key="k")
            await eventually(lambda: status_is(store, "k", Status.COMPLETED), 10, "'k' committed")
            await settle_all(broker, settings, dead_letters=0)
            await finished(consumer, broker, settings, dead_letters=0)
            assert proxy.held >= 1
            assert [r[0] for r in await rows(db, "SELECT key FROM {}", business_table)] == ["k"]
            record = await store.get("k")
            assert record is not None
            assert record.status is Status.COMPLETED
            assert record.result == {"recorded": "k"}
        finally:
            await store.close()
    finally:
        await proxy.close()
