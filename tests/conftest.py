"""Fixtures shared by every suite: real servers and store factories."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from semel.consumer.container import store_options
from semel.settings import Settings
from semel.stores.base import Store
from tests import rabbitmq4, redis_connections, redis_servers, servers

POSTGRES_DSN = "postgresql://localhost/test"

# Every store backend, each on one real server; DynamoDB twice, on two independent servers.
BACKENDS = ["sqlite", "postgres", "redis", "dynamodb-moto", "dynamodb-dynalite"]
# Redis also as a Sentinel-managed primary and as a Cluster (tests/redis_servers.py),
# which the store contract and the Redis tests run on too.
REDIS_TOPOLOGIES = ["redis-sentinel", "redis-cluster"]
CONTRACT_BACKENDS = [*BACKENDS, *REDIS_TOPOLOGIES]


@pytest.fixture(scope="session")
def postgres_server() -> str:
    servers.ensure_service("postgres")
    return POSTGRES_DSN


@pytest.fixture(scope="session")
def redis_server() -> str:
    servers.ensure_service("redis")
    return "redis://localhost:6379/0"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[redis_servers.Cluster]:
    """A private Redis Cluster of 3 primaries and 3 replicas; healthy whenever a test
    gets it (a test that kills a node brings it back)."""
    with redis_servers.running(redis_servers.Cluster()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[redis_servers.SentinelSet]:
    """A private primary, its replica and 3 sentinels."""
    with redis_servers.running(redis_servers.SentinelSet()) as sentinels:
        yield sentinels


# Which RabbitMQ the broker tests run against: the machine's own (3.10 on
# Debian 12) or Debian 13's 4.0 from tests/rabbitmq4.py. An environment
# variable too, so child processes (the chaos run) follow the same lane.
RABBITMQ_LANES = ("3", "4")
RABBITMQ_ENV = "SEMEL_TEST_RABBITMQ"


def pytest_configure(config: pytest.Config) -> None:
    # A test that leaves a redis-py connection open fails itself, not a later one.
    config.pluginmanager.register(redis_connections.Plugin(), "redis-connections")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rabbitmq",
        choices=RABBITMQ_LANES,
        default=os.environ.get(RABBITMQ_ENV, "3"),
        help="the broker lane: 3 = the machine's RabbitMQ, 4 = RabbitMQ 4.0 from a Debian 13 root",
    )


def rabbitmq_lane(config: pytest.Config) -> str:
    lane: str = config.getoption("--rabbitmq")
    return lane


def pytest_report_header(config: pytest.Config) -> str:
    # Which FastStream the middleware's tests meet (CI runs the oldest and the newest).
    try:
        faststream = importlib.metadata.version("faststream")
    except importlib.metadata.PackageNotFoundError:
        faststream = "not installed"
    return f"rabbitmq lane: {rabbitmq_lane(config)}; faststream {faststream}"


@pytest.fixture(scope="session")
def rabbitmq_server(pytestconfig: pytest.Config) -> str:
    lane = rabbitmq_lane(pytestconfig)
    os.environ[RABBITMQ_ENV] = lane
    if lane == "4":
        return rabbitmq4.ensure_rabbitmq4()
    servers.ensure_service("rabbitmq")
    return "amqp://guest:guest@localhost:5672/"


Rabbitmqctl = Callable[..., Awaitable[str]]


@pytest.fixture(scope="session")
def rabbitmqctl(pytestconfig: pytest.Config, rabbitmq_server: str) -> Rabbitmqctl:
    """``rabbitmqctl`` against the lane's broker; returns its output, fails the test on error."""
    if rabbitmq_lane(pytestconfig) == "4":
        prefix, env = rabbitmq4.SHARED.ctl(), rabbitmq4.SHARED.env()
    else:
        prefix, env = ["rabbitmqctl"], None

    async def run(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            *prefix, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    return run


@pytest.fixture(scope="session")
def rabbitmq_port(rabbitmq_server: str) -> int:
    port = urlsplit(rabbitmq_server).port
    assert port is not None
    return port


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
        # One attempt: store tests lower the claims allowed and the retention
        # freely, and more attempts than claims, or retries outlasting the
        # retention, are refused. Consumer tests set their own (FAST).
        "max_attempts": 1,
        "metrics_port": 0,
        # SEMEL_HANDLER has no default: a consumer these settings start runs the
        # bundled example unless a test names another.
        "handler": "semel.consumer.examples:order_paid",
    }
    if backend == "sqlite":
        base |= {"store": "sqlite", "sqlite_path": str(tmp_path / "semel.db")}
    elif backend == "postgres":
        base |= {"store": "postgres", "postgres_dsn": request.getfixturevalue("postgres_server")}
    elif backend == "redis":
        base |= {"store": "redis", "redis_url": request.getfixturevalue("redis_server")}
    elif backend in REDIS_TOPOLOGIES:
        topology = request.getfixturevalue(backend.replace("-", "_"))
        base |= {"store": "redis", "redis_url": topology.url}
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
