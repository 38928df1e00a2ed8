"""The store's private server for a chaos run, and how to take it away.

The shared system services stay untouched: every store fault of a chaos run
hits a server that the run started itself, on a free loopback port, in a
temporary directory, and stops again at the end. As root, PostgreSQL runs as
its own service user, as its package expects.

``settings(port)`` points a client at another port than the server's own
(:attr:`StoreServer.client_port`): a :class:`~tests.proxy.TcpProxy` in front
of the server, which a fault can stall or slow down.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.chaos.processes import Child, as_user, on_exit, private_dir, run
from tests.chaos.verdict import Failover
from tests.proxy import TcpProxy
from tests.redis_servers import Cluster, SentinelSet
from tests.servers import ROOT, free_port

# Bytes of room a filled-up Redis keeps above what it used when the limit was set.
FULL_HEADROOM = 16 * 1024


class StoreServer:
    """The store of a run: how the workers reach it and how to take it away."""

    outage_kind = "skipped: embedded file, no server"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.outages: list[tuple[float, float]] = []  # wall-clock windows the store was away

    @property
    def client_port(self) -> int | None:
        """The loopback port clients connect to; None: no server, no port."""
        return None

    def settings(self, port: int | None = None) -> dict[str, object]:
        return {"store": "sqlite", "sqlite_path": str(self.home / "semel.db")}

    @property
    def can_fail(self) -> bool:
        return False

    async def outage(self, seconds: float) -> None:
        raise NotImplementedError

    def logs(self) -> list[Path]:
        """The server's own log files, kept with a run's ledger (evidence of a failure)."""
        return []

    async def stop(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


class PrivateRedis(StoreServer):
    """redis-server with an fsync-always append-only file, so a SIGKILL loses no key."""

    outage_kind = "server SIGKILLed, restarted from its AOF"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_port()
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(home)]
        self.child = Child(argv, self.port, home / "redis.log")

    @property
    def client_port(self) -> int:
        return self.port

    def settings(self, port: int | None = None) -> dict[str, object]:
        return {"store": "redis", "redis_url": f"redis://127.0.0.1:{port or self.port}/0"}

    @property
    def can_fail(self) -> bool:
        return True

    async def outage(self, seconds: float) -> None:
        self.child.kill()
        await asyncio.sleep(seconds)
        await asyncio.to_thread(self.child.start)

    async def fill_up(self, seconds: float, headroom: int = FULL_HEADROOM) -> int:
        """Refuse writes with ``OOM`` for ``seconds``: ``maxmemory`` just above what is used.

        ``noeviction`` keeps Redis from making room by dropping keys, so every
        write that would grow the data set gets ``OOM command not allowed``
        once the few bytes of ``headroom`` are used up (reads still answer).
        The old policy and limit are put back afterwards. Returns how many
        commands the server refused with ``OOM`` meanwhile.
        """
        import redis.asyncio as aioredis  # the redis extra; only this store needs it

        admin = aioredis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=10, decode_responses=True
        )
        try:
            old = {str(k): str(v) for k, v in (await admin.config_get("maxmemory*")).items()}
            refused = await _oom_errors(admin)
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", str(used + headroom))
            try:
                await asyncio.sleep(seconds)
            finally:
                await admin.config_set("maxmemory", old["maxmemory"])
                await admin.config_set("maxmemory-policy", old["maxmemory-policy"])
            return await _oom_errors(admin) - refused
        finally:
            await admin.aclose()


async def _oom_errors(admin: Any) -> int:
    """Replies the server gave with the ``OOM`` error code so far (``INFO errorstats``)."""
    stats = await admin.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


class PrivatePostgres(StoreServer):
    """A throw-away PostgreSQL cluster (initdb + pg_ctl), stopped with ``-m immediate``."""

    outage_kind = "server stopped (pg_ctl -m immediate), started"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_port()
        self.data = home / "data"
        bin_dir = Path("/usr/lib/postgresql/15/bin")
        self.pg_ctl = str(bin_dir / "pg_ctl") if bin_dir.exists() else "pg_ctl"
        self.initdb = str(bin_dir / "initdb") if bin_dir.exists() else "initdb"
        self.options = (
            f"-p {self.port} -k {home} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=300"
        )
        on_exit(self._halt)

    async def create(self) -> None:
        argv = [self.initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"]
        await run(as_user("postgres", [*argv, "-E", "UTF8"]), 120)
        await self._start()

    async def _start(self) -> None:
        log = str(self.home / "postgres.log")
        argv = [self.pg_ctl, "-D", str(self.data), "-o", self.options, "-l", log]
        await run(as_user("postgres", [*argv, "-w", "-t", "60", "start"]), 90)

    async def _stop(self) -> None:
        argv = [self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        await run(as_user("postgres", argv), 60)

    @property
    def client_port(self) -> int:
        return self.port

    def settings(self, port: int | None = None) -> dict[str, object]:
        dsn = f"postgresql://postgres@127.0.0.1:{port or self.port}/postgres"
        return {"store": "postgres", "postgres_dsn": dsn}

    @property
    def can_fail(self) -> bool:
        return True

    async def outage(self, seconds: float) -> None:
        await self._stop()
        await asyncio.sleep(seconds)
        await self._start()

    def _halt(self) -> None:
        if (self.data / "postmaster.pid").exists():
            argv = [self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]
            subprocess.run(as_user("postgres", argv), capture_output=True, timeout=60, check=False)
        shutil.rmtree(self.home, ignore_errors=True)

    async def stop(self) -> None:
        await asyncio.to_thread(self._halt)


class PrivateDynamo(StoreServer):
    """moto behind a TCP proxy: moto keeps its tables in memory, so the outage cuts the port."""

    outage_kind = "port cut by a TCP proxy (moto is in-memory)"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_port()
        # One request at a time: moto's threaded server does not apply a
        # conditional write atomically (see tests/moto_serial.py).
        argv = [sys.executable, str(ROOT / "tests" / "moto_serial.py"), str(self.port)]
        self.child = Child(argv, self.port, home / "moto.log")
        self.proxy = TcpProxy(self.port, free_port())

    async def open(self) -> None:
        await asyncio.to_thread(self.child.start)
        await self.proxy.start()

    @property
    def client_port(self) -> int:
        return self.proxy.port  # the outage cuts this proxy: clients are behind it

    def settings(self, port: int | None = None) -> dict[str, object]:
        endpoint = f"http://127.0.0.1:{port or self.proxy.port}"
        return {"store": "dynamodb", "dynamodb_endpoint_url": endpoint}

    @property
    def can_fail(self) -> bool:
        return True

    async def outage(self, seconds: float) -> None:
        await self.proxy.cut()
        await asyncio.sleep(seconds)
        await self.proxy.start()

    async def stop(self) -> None:
        await self.proxy.cut()
        self.child.kill()
        await super().stop()


class PrivateRedisTopology(StoreServer):
    """A replicated Redis (:mod:`tests.redis_servers`): a Cluster or a primary under Sentinel.

    Its outage is a failover: the primary (under Cluster, the one serving the
    first slots: a third of the keys) is SIGKILLed, its replica promoted, and
    the old primary started again as the new primary's replica. Nothing is
    kept on disk, so a write the primary acknowledged but had not sent to its
    replica is gone; ``replicas_ack`` >= 1 makes every write wait for one.
    """

    outage_kind = "primary SIGKILLed, replica promoted, old primary back as replica"

    def __init__(self, home: Path, topology: Cluster | SentinelSet, replicas_ack: int) -> None:
        super().__init__(home)
        self.topology = topology
        self.replicas_ack = replicas_ack
        self.failovers: list[Failover] = []

    def settings(self, port: int | None = None) -> dict[str, object]:
        return {
            "store": "redis",
            "redis_url": self.topology.url,
            "redis_replicas_ack": self.replicas_ack,
        }

    @property
    def can_fail(self) -> bool:
        return True

    async def outage(self, seconds: float) -> None:
        """Fail the primary over and heal; ``seconds`` is unused: a failover takes its own."""
        killed = time.time()
        victim = await asyncio.to_thread(self.topology.kill_primary)
        self.failovers.append(Failover(killed, time.time()))
        await asyncio.to_thread(self.topology.heal, victim)

    def logs(self) -> list[Path]:
        return sorted(self.topology.root.glob("*/*.log"))  # each node's and sentinel's

    async def stop(self) -> None:
        await asyncio.to_thread(self.topology.stop)
        await super().stop()


REPLICATED: dict[str, type[Cluster] | type[SentinelSet]] = {
    "redis-cluster": Cluster,
    "redis-sentinel": SentinelSet,
}


async def start_store(kind: str, replicas_ack: int = 0) -> StoreServer:
    """Start a private server for ``kind`` (sqlite, postgres, redis, dynamodb, or a
    replicated Redis: redis-cluster, redis-sentinel, with ``replicas_ack``)."""
    if kind in REPLICATED:
        topology = REPLICATED[kind]()
        server = PrivateRedisTopology(private_dir(f"semel-chaos-{kind}-"), topology, replicas_ack)
        try:
            await asyncio.to_thread(topology.start)
        except BaseException:
            await server.stop()
            raise
        return server
    if kind == "sqlite":
        return StoreServer(private_dir("semel-chaos-sqlite-"))
    if kind == "redis":
        redis = PrivateRedis(private_dir("semel-chaos-redis-"))
        await asyncio.to_thread(redis.child.start)
        return redis
    if kind == "postgres":
        postgres = PrivatePostgres(private_dir("semel-chaos-pg-", owner="postgres"))
        try:
            await postgres.create()
        except BaseException:
            await postgres.stop()
            raise
        return postgres
    if kind == "dynamodb":
        dynamo = PrivateDynamo(private_dir("semel-chaos-dynamodb-"))
        await dynamo.open()
        return dynamo
    raise ValueError(f"unknown store {kind!r}")
