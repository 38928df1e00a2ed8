"""The consumers under test, each a child process: the bare baseline, semel's worker,
and a FastStream app with or without semel's middleware.

A child's output goes to a log file under the output folder (semel's JSON
log, which the latency phase reads); the log is removed once the case that
made it is done, unless it failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.probes import PROBE_FILE_ENV
from semel.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
AMQP_PORT = 5672
STOP_WAIT = 30.0  # seconds a child gets to stop after SIGTERM
MIDDLEWARE_ENV = "BENCH_MIDDLEWARE"  # the FastStream app's middleware, if any
SEMEL_MIDDLEWARE = "semel"
PROFILE_ENV = "BENCH_PROFILE"  # where the FastStream app writes its cProfile statistics


def semel_env(settings: Settings) -> dict[str, str]:
    """This process's environment, with ``settings`` as its only ``SEMEL_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    return env | settings.as_env()


@dataclass
class Child:
    """One consumer process."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    signalled: bool = False

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        env: dict[str, str],
        logs: Path,
        *,
        cwd: Path = ROOT,
        path: Path = ROOT,
    ) -> Child:
        """``path`` is the child's ``PYTHONPATH``: this checkout, unless the child is
        another revision of semel, which must not import this checkout's code."""
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        env = env | {"PYTHONPATH": str(path)}
        with log.open("wb") as out:
            process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=out)
        return cls(name, process, log)

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss(self) -> int:
        """Resident memory in bytes."""
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def cpu_seconds(self) -> float:
        try:
            times = psutil.Process(self.process.pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return float(times.user + times.system)

    def amqp_ports(self) -> set[int]:
        """Local ports of this process's connections to the broker."""
        try:
            connections = psutil.Process(self.process.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return set()
        return {c.laddr.port for c in connections if c.raddr and c.raddr.port == AMQP_PORT}

    def terminate(self) -> None:
        # Once only: a second SIGTERM can land after the consumer removed its
        # handlers on the way out, and would kill it with -15.
        if self.alive() and not self.signalled:
            self.process.send_signal(signal.SIGTERM)
            self.signalled = True

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not go; returns the exit code."""
        self.terminate()
        try:
            return self.process.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def discard_log(self) -> None:
        self.log.unlink(missing_ok=True)


def start_semel(name: str, settings: Settings, logs: Path, probes: Path | None = None) -> Child:
    env = semel_env(settings)
    if probes is not None:
        env[PROBE_FILE_ENV] = str(probes)
    return Child.start(name, [sys.executable, "-m", "semel"], env, logs)


def bare_env(settings: Settings) -> dict[str, str]:
    """What a consumer that is not semel's worker is told: the broker, queue and prefetch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    return env | {
        "BENCH_AMQP_URL": settings.amqp_url,
        "BENCH_QUEUE": settings.queue,
        "BENCH_PREFETCH": str(settings.prefetch),
    }


def start_baseline(name: str, settings: Settings, logs: Path, probes: Path | None = None) -> Child:
    env = bare_env(settings)
    if probes is not None:
        env[PROBE_FILE_ENV] = str(probes)
    return Child.start(name, [sys.executable, "-m", "bench.baseline"], env, logs)


def start_faststream(
    name: str, settings: Settings, logs: Path, *, middleware: bool, profile: Path | None = None
) -> Child:
    """The FastStream app; with ``middleware``, semel's on ``settings`` (store, key prefix).
    With ``profile`` (a folder), it profiles itself into ``<profile>/<name>.prof``."""
    env = bare_env(settings)
    if middleware:
        env |= settings.as_env() | {MIDDLEWARE_ENV: SEMEL_MIDDLEWARE}
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        env[PROFILE_ENV] = str(profile / f"{name}.prof")
    return Child.start(name, [sys.executable, "-m", "bench.faststream_app"], env, logs)


def _last_sends() -> dict[int, float]:
    """Seconds since the last send, per local port of every socket to the broker."""
    out = subprocess.run(
        ["ss", "-tinH", "dport", "=", f":{AMQP_PORT}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ages: dict[int, float] = {}
    port: int | None = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            local = line.split()[3]
            port = int(local.rsplit(":", 1)[1])
            continue
        for field in line.split():
            if field.startswith("lastsnd:") and port is not None:
                ages[port] = int(field.removeprefix("lastsnd:")) / 1000
    return ages


class Group:
    """The consumers of one case, watched together."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = list(children)

    def alive(self) -> bool:
        return all(child.alive() for child in self.children)

    def quiet_for(self) -> float:
        """Seconds since any of them last sent a frame to the broker (0 when unknown)."""
        ports = set().union(*(child.amqp_ports() for child in self.children))
        ages = _last_sends()
        known = [ages[port] for port in ports if port in ages]
        return min(known) if known and len(known) == len(ports) else 0.0

    def cpu_seconds(self) -> float:
        return sum(child.cpu_seconds() for child in self.children)

    def unacked(self) -> int | None:
        """Deliveries their channels hold unacknowledged; ``None`` if no channel is found."""
        ports = set().union(*(child.amqp_ports() for child in self.children))
        out = subprocess.run(
            ["rabbitmqctl", "list_channels", "name", "messages_unacknowledged", "-q"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        held, found = 0, False
        for line in out.splitlines():
            # A channel is named "127.0.0.1:<client port> -> 127.0.0.1:5672 (<number>)".
            name, _, count = line.rpartition("\t")
            client = name.split(" -> ")[0]
            if client.rpartition(":")[2].isdigit() and int(client.rpartition(":")[2]) in ports:
                held += int(count)
                found = True
        return held if found else None

    def stop(self) -> list[int]:
        for child in self.children:
            child.terminate()  # all at once, then wait for each
        return [child.stop() for child in self.children]
