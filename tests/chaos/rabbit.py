"""A private RabbitMQ node for a chaos run, restartable with stop_app / start_app.

A second node on this machine, beside the shared one: its own name, ports,
config, data and log directories, all under a temporary directory. The
shared node's environment file still applies (loopback distribution); the
node name, ports and paths given here override it.

``lane="4"`` runs the node from the Debian 13 root of :mod:`tests.rabbitmq4`
(RabbitMQ 4.0) instead of the machine's own RabbitMQ; its directory is then
inside the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests import rabbitmq4
from tests.chaos.processes import on_exit, private_dir, run, wait_gone

# aiormq leaves its own Connection.close coroutine unawaited when the broker is
# restarted under a connection; a run that restarts it checks the outcome itself.
RESTART_WARNINGS = (
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <coroutine object Connection.close"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:coroutine 'Connection.close' was never awaited:RuntimeWarning"
    ),
)
LANE_ENV = "SEMEL_TEST_RABBITMQ"  # "3": the machine's RabbitMQ, "4": Debian 13's


def bindable(port: int) -> bool:
    """Nothing holds ``port`` on loopback, not even an outgoing connection."""
    with contextlib.closing(socket.socket()) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pair_of_free_ports(offset: int) -> int:
    # RabbitMQ's distribution port is the AMQP port + offset; both must be free,
    # and both below the kernel's ephemeral range, where any outgoing connection
    # may take a port between our check and the node's bind.
    ephemeral = _ephemeral_start()
    for _ in range(200):
        port = random.randint(10_000, ephemeral - offset - 1)
        if bindable(port) and bindable(port + offset):
            return port
    raise RuntimeError("no free port pair for a private RabbitMQ node")


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


class RabbitNode:
    """A second RabbitMQ node on a private port, restartable with stop_app / start_app."""

    DIST_OFFSET = rabbitmq4.DIST_OFFSET

    def __init__(self, port: int, home: Path, release: rabbitmq4.Node | None = None) -> None:
        self.port = port
        self.home = home  # on the host's file system
        self.node = f"semel-chaos-{port}@localhost"
        self.release = release  # None: the machine's own RabbitMQ
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"
        self.restarts = 0
        self.launched = False
        self._cleanup = on_exit(self._halt)

    @classmethod
    async def start(
        cls, deadline: float = 120.0, attempts: int = 2, lane: str | None = None
    ) -> RabbitNode:
        """A node that answers; a start that fails is retried once on other ports."""
        lane = lane or os.environ.get(LANE_ENV, "3")
        for attempt in range(1, attempts + 1):
            node = cls._prepare() if lane == "3" else cls._prepare_in_root()
            try:
                node.launched = True
                await run(node._argv("rabbitmq-server", "-detached"), 60, env=node._env())
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

    @classmethod
    def _prepare_in_root(cls) -> RabbitNode:
        root = rabbitmq4.ensure_root()
        port = _pair_of_free_ports(cls.DIST_OFFSET)
        inside = tempfile.mkdtemp(prefix="semel-chaos-rabbit-", dir=root / "tmp")
        release = rabbitmq4.Node(
            f"semel-chaos-{port}@localhost", port, inside.removeprefix(str(root))
        )
        release.prepare()
        return cls(port, Path(inside), release)

    def _argv(self, program: str, *args: str) -> list[str]:
        if self.release is None:
            return [program, *args]
        return self.release.argv(program, *args)

    def log_tail(self, lines: int = 30) -> str:
        dump = self.home / "erl_crash.dump"
        if dump.exists():
            return "\n".join(dump.read_text(errors="replace").splitlines()[:3])
        logs = sorted((self.home / "log").glob("*.log"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return "(no node log)"
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])

    def _crashed(self) -> bool:
        """The VM died at boot (a port taken, say): it leaves a crash dump, no log."""
        return (self.home / "erl_crash.dump").exists()

    def _env(self) -> dict[str, str]:
        if self.release is not None:
            return self.release.env()
        return os.environ | rabbitmq4.node_env(self.node, self.port, str(self.home))

    async def ctl(self, *args: str, limit: float = 60.0) -> str:
        return await run(self._argv("rabbitmqctl", "-n", self.node, *args), limit, env=self._env())

    async def await_startup(self, deadline: float) -> None:
        """The detached server registers its node name a moment after the command returns."""
        end = asyncio.get_running_loop().time() + deadline
        while True:
            try:
                await self.ctl("await_startup", "--timeout", "30", limit=40)
                return
            except RuntimeError:
                if asyncio.get_running_loop().time() > end or self._crashed():
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
        # A node still booting has no pid file yet: stopping it now would miss it.
        end = time.monotonic() + 20
        while self.launched and self._pid() is None and not self._crashed():
            if time.monotonic() > end:
                break
            time.sleep(0.2)
        if not self._crashed():
            # No pid file argument: with one, stop waits for a node that never
            # started to write it, forever.
            ctl = subprocess.Popen(
                self._argv("rabbitmqctl", "-n", self.node, "stop"),
                env=self._env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                ctl.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(ctl.pid, signal.SIGKILL)
                ctl.wait()
        pid = self._pid()
        if pid is not None:
            wait_gone(pid, 30)
        shutil.rmtree(self.home, ignore_errors=True)

    def _pid(self) -> int | None:
        try:
            return int((self.home / "node.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        self._cleanup()
