"""One ``redis-server`` process of a test topology, and the waits the topologies share."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from redis import Redis
from redis.exceptions import RedisError

from tests.servers import ServerExited, free_port, wait_for_port

HOST = "127.0.0.1"
DEADLINE = 30.0  # seconds any awaited topology change may take

T = TypeVar("T")


def until(check: Callable[[], T | None], what: str, deadline: float = DEADLINE) -> T:
    """Poll ``check`` until it returns something true; fail after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        with contextlib.suppress(RedisError, OSError):
            found = check()
            if found:
                return found
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {deadline:g}s")
        time.sleep(0.05)


@dataclass
class Server:
    """One ``redis-server`` process: its port, directory and options."""

    port: int
    workdir: Path
    options: list[str]
    process: subprocess.Popen[bytes] | None = None

    def start(self, *once: str) -> Server:
        """Start with :attr:`options`, and ``once`` for this start only."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "stdout.log").open("ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", *self.options, *once], cwd=self.workdir, stdout=log, stderr=log
            )
        try:
            wait_for_port(self.port, 10.0, HOST, self.process)
        except ServerExited as exc:  # say why: its log names the port it could not bind
            logs = (self.workdir / "redis.log", self.workdir / "stdout.log")
            tail = " | ".join(f.read_text()[-600:].strip() for f in logs if f.exists())
            raise ServerExited(f"{exc}: {tail}") from None
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no goodbye to the cluster, the sentinels or the clients."""
        if self.process is not None and self.alive:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or not self.alive:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def client(self) -> Redis:
        return Redis(HOST, self.port, socket_timeout=2, socket_connect_timeout=2)

    def info(self, section: str) -> dict[str, object]:
        with self.client() as client:
            found: dict[str, object] = client.info(section)
            return found


def data_options(port: int, workdir: Path) -> list[str]:
    return [
        *("--port", str(port), "--bind", HOST, "--dir", str(workdir)),
        *("--save", "", "--appendonly", "no", "--logfile", "redis.log"),
    ]


class Topology:
    """Servers started together and stopped together."""

    def __init__(self) -> None:
        # In memory where the machine has it: a cluster node rewrites and fsyncs
        # nodes.conf (a sentinel its configuration) on every change of slots or
        # roles, blocking meanwhile, and a reshard of 3,000 slots is thousands
        # of them. A node blocked past the 1 s node timeout by a disk that the
        # suite's databases keep busy would be failed over.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        prefix = f"semel-{type(self).__name__.lower()}-"
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=shm))
        self.servers: list[Server] = []
        atexit.register(self.stop)

    def _server(self, name: str, options: Callable[[int, Path], list[str]]) -> Server:
        port = free_port()
        workdir = self.root / f"{name}-{port}"
        server = Server(port, workdir, options(port, workdir))
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def in_sync(replica: Server) -> bool:
        """The replica's link to its primary is up and it has what the primary sent."""
        info = replica.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"
