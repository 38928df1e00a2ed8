"""Fixtures of the front-door tests: the consumer tests' private topology per test,
and a started :class:`Semel` on the same settings."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from semel.consumer.embedded import Semel
from semel.settings import Settings
from tests.consumer.conftest import backend, broker, consumer_settings, settings, store
from tests.consumer.harness import Broker

__all__ = ["backend", "broker", "consumer_settings", "settings", "store"]


@pytest.fixture
async def semel(settings: Settings, broker: Broker) -> AsyncIterator[Semel]:
    """Closed before ``broker`` deletes the test's queues under its delay consumers."""
    async with Semel(settings) as started:
        yield started
