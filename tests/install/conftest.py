"""The wheel built from the checkout and the fresh venv it is installed into, once per session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from semel.settings import Settings, derived
from tests.consumer.harness import Broker
from tests.install.fresh import Venv, built_wheel, fresh_venv, session_folder


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_wheel(session_folder(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    return fresh_venv(session_folder(tmp_path_factory.getbasetemp()), wheel)


@pytest.fixture
async def settings(rabbitmq_server: str) -> Settings:
    """The test's own queue and exchange (the project's worker gets them as SEMEL_* variables)."""
    run = uuid.uuid4().hex[:10]
    return Settings(amqp_url=rabbitmq_server, queue=f"t.{run}.work", exchange=f"t.{run}.events")


# An app's handler, by name, and the retry delays its queue was declared with.
HandlerQueues = dict[str, list[float]]


@pytest.fixture
def handler_queues() -> HandlerQueues:
    """The handlers of an app the test runs: their queues are deleted afterwards too."""
    return {}


@pytest.fixture
async def broker(settings: Settings, handler_queues: HandlerQueues) -> AsyncIterator[Broker]:
    connected = await Broker.connect(settings.amqp_url)
    try:
        yield connected
    finally:
        await connected.delete_topology(settings)
        for name, delays in handler_queues.items():
            own = derived(settings, queue=f"{settings.queue}.{name}", retry_delays=delays)
            await connected.delete_topology(own)
        await connected.close()
