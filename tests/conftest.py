"""Fixtures shared by every suite: real servers and store factories."""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer.container import store_options
from settings import Settings
from stores.base import Store
from tests import servers

POSTGRES_DSN = "postgresql://localhost/test"

# Every store the contract runs against; DynamoDB twice, on two independent servers.
BACKENDS = ["sqlite", "postgres", "redis", "dynamodb-moto", "dynamodb-dynalite"]


@pytest.fixture(scope="session")
def postgres_server() -> str:
    servers.ensure_service("postgres")
    return POSTGRES_DSN


@pytest.fixture(scope="session")
def redis_server() -> str:
    servers.ensure_service("redis")
    return "redis://localhost:6379/0"


@pytest.fixture(scope="session")
def rabbitmq_server() -> str:
    servers.ensure_service("rabbitmq")
    return "amqp://guest:guest@localhost:5672/"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    servers.aws_test_credentials()
    with servers.moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def dynalite_endpoint() -> Iterator[str]:
    servers.aws_test_credentials()
    with servers.dynalite_server() as url:
        yield url


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def backend() -> str:
    """The store under test; tests override it with ``parametrize("backend", BACKENDS)``."""
    return "sqlite"


@pytest.fixture
def make_settings(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> SettingsFactory:
    """Settings for the backend under test, isolated by a fresh key prefix."""
    base: dict[str, Any] = {
        "key_prefix": "t" + uuid.uuid4().hex[:12],
        "retry_delays": [0.1],
        "metrics_port": 0,
    }
    if backend == "sqlite":
        base |= {"store": "sqlite", "sqlite_path": str(tmp_path / "semel.db")}
    elif backend == "postgres":
        base |= {"store": "postgres", "postgres_dsn": request.getfixturevalue("postgres_server")}
    elif backend == "redis":
        base |= {"store": "redis", "redis_url": request.getfixturevalue("redis_server")}
    else:
        server = backend.removeprefix("dynamodb-")
        base |= {
            "store": "dynamodb",
            "dynamodb_endpoint_url": request.getfixturevalue(f"{server}_endpoint"),
        }

    def factory(**overrides: Any) -> Settings:
        return Settings(**(base | overrides))

    return factory


StoreFactory = Callable[..., Awaitable[Store]]


async def open_store(settings: Settings) -> Store:
    """Open the settings' backend the way the container does."""
    options = store_options(settings)
    module = importlib.import_module(options.module)
    store: Store = await module.open_store(**options.kwargs)
    return store


@pytest.fixture
async def make_store(make_settings: SettingsFactory) -> AsyncIterator[StoreFactory]:
    """Open migrated stores of the backend under test; closes them after the test."""
    opened: list[Store] = []

    async def factory(**overrides: Any) -> Store:
        store = await open_store(make_settings(**overrides))
        opened.append(store)
        await store.migrate()
        return store

    yield factory
    for store in opened:
        await store.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """This process's environment, with ``settings`` as its only ``SEMEL_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    return env | settings.as_env()
