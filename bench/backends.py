"""The stores semel is measured with, set up for one benchmark run and removed after it.

Each case gets a fresh queue, exchange and key prefix (and a fresh SQLite
file), so no case reads another's keys. The run's PostgreSQL table and Redis
keys carry the run's id and are dropped at the end; the DynamoDB-compatible
server (moto by default, or dynalite) is a child process of the run, and so
is the Redis Cluster of the ``redis-cluster`` cases (3 primaries with a
replica each, on loopback, nothing kept on disk: ``tests.redis_servers``).
``redis-cluster-ack1`` is the same cluster with ``SEMEL_REDIS_REPLICAS_ACK=1``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import redis
from yarl import URL

from bench.broker import AMQP_URL
from semel.consumer.container import store_options
from semel.settings import Settings
from semel.stores.base import Store
from tests import redis_servers, servers

POSTGRES_DSN = os.environ.get("BENCH_POSTGRES_DSN", "postgresql://localhost/test")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://localhost:6379/0")
# The consumers' broker URL. Heartbeats every 5 minutes instead of every 30 s:
# a drain's end is read off a consumer's last frame to the broker, and a
# heartbeat is a frame too.
CHILD_AMQP_URL = str(URL(AMQP_URL).update_query(heartbeat=600))
PREFETCH = 256
HANDLER = "bench.handlers:handle"
# Store kinds measured: semel's store of each, the Redis Cluster with and without
# replica acknowledgements (SEMEL_REDIS_REPLICAS_ACK) as kinds of their own.
CLUSTER = "redis-cluster"
CLUSTER_ACKED = "redis-cluster-ack1"
CLUSTER_ACKS = {CLUSTER: 0, CLUSTER_ACKED: 1}
STORES = ("sqlite", "postgres", "redis", CLUSTER, CLUSTER_ACKED, "dynamodb")
DYNAMODB_SERVERS = {"moto": servers.moto_server, "dynalite": servers.dynalite_server}
_SERVICES = {"postgres": "postgres", "redis": "redis"}


class Backends:
    """The servers and names of one run; use as a context manager."""

    def __init__(self, stores: list[str], dynamodb_server: str = "moto") -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.stores = stores
        self.dynamodb_server = dynamodb_server
        self._cases = 0
        self._stack = contextlib.ExitStack()
        self._tmp = Path(tempfile.mkdtemp(prefix=f"semel-bench-{self.run_id}-"))
        self.dynamodb_url: str | None = None
        self.cluster_url: str | None = None

    def __enter__(self) -> Backends:
        servers.ensure_service("rabbitmq")
        for store in self.stores:
            if store in _SERVICES:
                servers.ensure_service(_SERVICES[store])
        if set(self.stores) & set(CLUSTER_ACKS):
            cluster = self._stack.enter_context(redis_servers.running(redis_servers.Cluster()))
            self.cluster_url = cluster.url
        if "dynamodb" in self.stores:
            servers.aws_test_credentials()
            server = DYNAMODB_SERVERS[self.dynamodb_server]()
            self.dynamodb_url = self._stack.enter_context(server)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if "postgres" in self.stores:
                with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
                    conn.execute(f"DROP TABLE IF EXISTS {self.table}")
            if "redis" in self.stores:
                client = redis.Redis.from_url(REDIS_URL)
                for key in client.scan_iter(match=f"{self.prefix_root}*", count=10_000):
                    client.unlink(key)
                client.close()
        finally:
            self._stack.close()
            shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def table(self) -> str:
        """The run's PostgreSQL and DynamoDB table."""
        return f"semel_bench_{self.run_id}"

    @property
    def prefix_root(self) -> str:
        return f"bench-{self.run_id}-"

    def settings(self, store: str, case: str) -> Settings:
        """Settings of a fresh case: its own queue, exchange, key prefix and SQLite file."""
        self._cases += 1
        name = f"bench.{self.run_id}.{self._cases}.{case}"
        values: dict[str, Any] = {
            "store": store,
            "amqp_url": CHILD_AMQP_URL,
            "queue": name,
            "exchange": f"{name}.events",
            "key_prefix": f"{self.prefix_root}{self._cases}",
            "prefetch": PREFETCH,
            "handler": HANDLER,
            "metrics_port": 0,
            "log_format": "json",
            "postgres_dsn": POSTGRES_DSN,
            "postgres_table": self.table,
            "redis_url": REDIS_URL,
            "dynamodb_table": self.table,
            "sqlite_path": str(self._tmp / f"{self._cases}.db"),
        }
        if self.dynamodb_url is not None:
            values["dynamodb_endpoint_url"] = self.dynamodb_url
        if store in CLUSTER_ACKS:
            assert self.cluster_url is not None
            values |= {"store": "redis", "redis_url": self.cluster_url}
            values["redis_replicas_ack"] = CLUSTER_ACKS[store]
        return Settings(**values)

    async def migrate(self, settings: Settings) -> None:
        """Create the store's table the way ``semel migrate`` does."""
        store = await open_store(settings)
        try:
            await store.migrate()
        finally:
            await store.close()


async def open_store(settings: Settings) -> Store:
    """The settings' store, opened the way the consumer's container opens it."""
    options = store_options(settings)
    module = importlib.import_module(options.module)
    store: Store = await module.open_store(**options.kwargs)
    return store
