"""Private servers for a chaos run: a RabbitMQ node and the store's server.

The shared system services stay untouched: every fault of a chaos run hits a
server that the run started itself, on free loopback ports, in a temporary
directory, and stops again at the end (an ``atexit`` hook catches the paths
that skip the ``finally`` blocks). As root, RabbitMQ and PostgreSQL run as
their own service users, as their packages expect.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.servers import ROOT, free_port, port_open, wait_for_port

_cleanups: list[Callable[[], None]] = []


def on_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run ``cleanup`` at interpreter exit unless it ran before; returns the once-only wrapper."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            with contextlib.suppress(Exception):
                cleanup()

    _cleanups.append(once)
    return once


@atexit.register
def _clean_all() -> None:
    for cleanup in reversed(_cleanups):
        cleanup()


def private_dir(prefix: str, owner: str | None = None) -> Path:
    """A fresh temporary directory, handed to ``owner`` when we are root."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if owner and os.geteuid() == 0:
        shutil.chown(path, owner, owner)
    return path


def as_user(user: str, argv: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if os.geteuid() == 0 else argv


async def run(argv: list[str], limit: float, env: dict[str, str] | None = None) -> str:
    """Run a command without blocking the event loop; raise with its output on failure."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{argv[0]} {argv[1:3]} timed out after {limit:g}s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {text[-2000:]}")
    return text


def _pair_of_free_ports(offset: int) -> int:
    # RabbitMQ's distribution port is the AMQP port + offset; both must be free.
    for _ in range(200):
        port = random.randint(10_000, 65_535 - offset)
        if not port_open(port) and not port_open(port + offset):
            return port
    raise RuntimeError("no free port pair for a private RabbitMQ node")


class RabbitNode:
    """A second RabbitMQ node on a private port, restartable with stop_app / start_app."""

    DIST_OFFSET = 20_000

    def __init__(self, port: int, home: Path) -> None:
        self.port = port
        self.home = home
        self.node = f"semel-chaos-{port}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"
        self.restarts = 0
        self._cleanup = on_exit(self._halt)

    @classmethod
    async def start(cls, deadline: float = 120.0, attempts: int = 2) -> RabbitNode:
        """A node that answers; a start that fails is retried once on other ports."""
        for attempt in range(1, attempts + 1):
            node = cls._prepare()
            try:
                await run(["rabbitmq-server", "-detached"], 60, env=node._env())
                await node.await_startup(deadline)
                return node
            except RuntimeError as exc:
                failure = f"{exc}\n{node.log_tail()}"
                node.stop()
                if attempt == attempts:
                    raise RuntimeError(f"private RabbitMQ node did not start: {failure}") from None
            except BaseException:
                node.stop()
                raise
        raise AssertionError("unreachable")

    @classmethod
    def _prepare(cls) -> RabbitNode:
        port = _pair_of_free_ports(cls.DIST_OFFSET)
        home = private_dir("semel-chaos-rabbit-", owner="rabbitmq")
        # Our own config file: the system one pins the listener to 5672.
        (home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{port}\n"
            "disk_free_limit.absolute = 50MB\n"
            "log.console = false\n"
        )
        (home / "enabled_plugins").write_text("[].\n")
        return cls(port, home)

    def log_tail(self, lines: int = 30) -> str:
        logs = sorted((self.home / "log").glob("*.log"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return "(no node log)"
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])

    def _gone(self) -> bool:
        """The node's OS process started and ended (a crash at boot)."""
        try:
            pid = int((self.home / "node.pid").read_text().strip())
        except (OSError, ValueError):
            return False  # not written yet
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def _env(self) -> dict[str, str]:
        home = str(self.home)
        return os.environ | {
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.port + self.DIST_OFFSET),
            "RABBITMQ_MNESIA_BASE": f"{home}/mnesia",
            "RABBITMQ_LOG_BASE": f"{home}/log",
            "RABBITMQ_PID_FILE": f"{home}/node.pid",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{home}/enabled_plugins",
            "RABBITMQ_CONFIG_FILE": f"{home}/rabbitmq",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{home}/advanced.config",
        }

    async def ctl(self, *args: str, limit: float = 60.0) -> str:
        return await run(["rabbitmqctl", "-n", self.node, *args], limit, env=self._env())

    async def await_startup(self, deadline: float) -> None:
        """The detached server registers its node name a moment after the command returns."""
        end = asyncio.get_running_loop().time() + deadline
        while True:
            try:
                await self.ctl("await_startup", "--timeout", "30", limit=40)
                return
            except RuntimeError:
                if asyncio.get_running_loop().time() > end or self._gone():
                    raise
            await asyncio.sleep(0.5)

    async def restart(self, down: float) -> None:
        """``rabbitmqctl stop_app``, ``down`` seconds without a broker, ``start_app``."""
        await self.ctl("stop_app")
        await asyncio.sleep(down)
        await self.ctl("start_app")
        await self.await_startup(60)
        self.restarts += 1

    def _halt(self) -> None:
        pid_file = self.home / "node.pid"
        with contextlib.suppress(Exception):
            # With a pid file, stop also waits for the OS process to end.
            subprocess.run(
                ["rabbitmqctl", "-n", self.node, "stop", str(pid_file)],
                env=self._env(),
                capture_output=True,
                timeout=60,
                check=False,
            )
        with contextlib.suppress(Exception):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        shutil.rmtree(self.home, ignore_errors=True)

    def stop(self) -> None:
        self._cleanup()


class StoreServer:
    """The store of a run: how the workers reach it and how to take it away."""

    outage_kind = "skipped: embedded file, no server"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.outages: list[tuple[float, float]] = []  # wall-clock windows the store was away

    def settings(self) -> dict[str, object]:
        return {"store": "sqlite", "sqlite_path": str(self.home / "semel.db")}

    @property
    def can_fail(self) -> bool:
        return False

    async def outage(self, seconds: float) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


class Child:
    """A server run as our child process, in its own process group."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.argv, self.port, self.log = argv, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        on_exit(self.kill)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )
        wait_for_port(self.port, 60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class PrivateRedis(StoreServer):
    """redis-server with an fsync-always append-only file, so a SIGKILL loses no key."""

    outage_kind = "server SIGKILLed, restarted from its AOF"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_port()
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(home)]
        self.child = Child(argv, self.port, home / "redis.log")

    def settings(self) -> dict[str, object]:
        return {"store": "redis", "redis_url": f"redis://127.0.0.1:{self.port}/0"}

    @property
    def can_fail(self) -> bool:
        return True

    async def outage(self, seconds: float) -> None:
        self.child.kill()
        await asyncio.sleep(seconds)
        await asyncio.to_thread(self.child.start)

    async def stop(self) -> None:
        self.child.kill()
        await super().stop()


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

    def settings(self) -> dict[str, object]:
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
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
        from tests.consumer.harness import TcpProxy  # pytest-free import path stays light

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

    def settings(self) -> dict[str, object]:
        endpoint = f"http://127.0.0.1:{self.proxy.port}"
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


async def start_store(kind: str) -> StoreServer:
    """Start a private server for ``kind`` (sqlite, postgres, redis or dynamodb)."""
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
