"""Fixtures of the fault tests: the consumer tests' private topology, store and ledger."""

from tests.consumer.conftest import (
    backend,
    broker,
    consumer_settings,
    ledger,
    settings,
    start_consumer,
    store,
)

__all__ = [
    "backend",
    "broker",
    "consumer_settings",
    "ledger",
    "settings",
    "start_consumer",
    "store",
]
