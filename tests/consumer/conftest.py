"""Fixtures of the consumer tests: a private, fast topology per test on the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from semel.settings import Settings
from semel.stores.base import Store
from tests.conftest import SettingsFactory, open_store
from tests.consumer.handlers import LEDGER_ENV
from tests.consumer.harness import Broker, InProcessConsumer

# One DynamoDB server is enough here (the store contract suite runs both). moto,
# run one request at a time so conditional writes stay atomic as on AWS; dynalite
# would crash whenever a test SIGKILLs a consumer in the middle of a request.
CONSUMER_BACKENDS = ["sqlite", "postgres", "redis", "dynamodb-moto"]

# Short delays so a retry or a conflict comes back in well under a second.
FAST: dict[str, Any] = {
    "retry_delays": [0.2, 0.4],
    "max_attempts": 3,
    "conflict_delay": 0.5,
    "lock_ttl": 1.5,
    "handler_timeout": 10.0,
    "shutdown_grace": 5.0,
    "broker_give_up": 30.0,
    "prefetch": 16,
    "max_body_bytes": 4096,
    "handler": "tests.consumer.handlers:scripted",
}

# A lease for tests whose handler must keep it: each renewal has two thirds of
# it to come back. With 1 s, a CI machine's stalls of 0.7 s cost a run its
# lease three times in one test, and the key ran four times.
KEPT_LEASE = 2.5

ConsumerSettings = Callable[..., Settings]


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> str:
    """The store under test; a module-level ``parametrize("backend", ...)`` overrides it.

    Autouse, so pytest sees the name in every test's closure (``make_settings``
    looks it up dynamically, which collection cannot see).
    """
    name: str = getattr(request, "param", "sqlite")
    return name


@pytest.fixture
async def consumer_settings(
    make_settings: SettingsFactory, rabbitmq_server: str
) -> ConsumerSettings:
    """Settings with a queue and an exchange no other test uses, and short delays."""
    run = uuid.uuid4().hex[:10]
    fixed = {"amqp_url": rabbitmq_server, "queue": f"t.{run}.work", "exchange": f"t.{run}.events"}
    base = make_settings(**(FAST | fixed))
    # Like `semel migrate` before `semel consume` (SQLite creates its table on open).
    store = await open_store(base)
    try:
        await store.migrate()
    finally:
        await store.close()

    def factory(**overrides: Any) -> Settings:
        return make_settings(**(FAST | fixed | overrides))  # validated, same key prefix

    return factory


@pytest.fixture
async def settings(consumer_settings: ConsumerSettings) -> Settings:
    return consumer_settings()


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    connected = await Broker.connect(settings.amqp_url)
    try:
        yield connected
    finally:
        await connected.delete_topology(settings)
        await connected.close()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Any]:
    """A second handle on the consumer's store, for looking at (and staging) records."""
    opened = await open_store(settings)
    try:
        yield opened
    finally:
        await opened.close()


StartConsumer = Callable[..., Awaitable[InProcessConsumer]]


@pytest.fixture
async def start_consumer(broker: Broker) -> AsyncIterator[StartConsumer]:
    """Start in-process consumers; any still running at the end is stopped."""
    started: list[InProcessConsumer] = []

    async def start(settings: Settings, store: Store | None = None) -> InProcessConsumer:
        consumer = InProcessConsumer(settings, store)
        started.append(consumer)
        return await consumer.start(broker, settings)

    yield start
    for consumer in started:
        if consumer.task is not None and not consumer.task.done():
            consumer.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.task, 30)


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where test handlers record each run (see tests.consumer.handlers)."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path
