"""The producing side of the run: uvicorn processes of the example, and ``semel relay`` ones.

Each slot is one process in its own process group, its output in a log file
of its own, replaced at once when the run SIGKILLs it (as a supervisor
would) and when it exits by itself (a web process whose start-up met
PostgreSQL down, say). A web slot listens on a port of its own; the load
driver goes to another port when one does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.processes import on_exit
from tests.servers import ROOT, free_port

APP = "examples.fastapi_outbox:app"
WEB = "web"
RELAY = "relay"


@dataclass(frozen=True, slots=True)
class Kill:
    """One SIGKILL of a producing process."""

    kind: str  # WEB or RELAY
    pid: int
    at: float


class Slot:
    """One process, started again whenever it dies."""

    def __init__(self, kind: str, name: str, argv: list[str], env: dict[str, str], logs: Path):
        self.kind, self.name, self.argv, self.logs = kind, name, argv, logs
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.env = env | {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.generation = 0

    def start(self) -> None:
        self.generation += 1
        log = self.logs / f"{self.name}.{self.generation}.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def wait(self, limit: float) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(limit)

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)


class Producers:
    """``web`` uvicorn processes of the example (the first ``relays_in_web`` of them with
    a relay inside) and ``relays`` ``semel relay`` processes."""

    def __init__(
        self, web: int, relays: int, relays_in_web: int, env: dict[str, str], logs: Path
    ) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(web)]
        uvicorn = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1"]
        quiet = ["--no-access-log", "--log-level", "warning"]
        self.web = [
            Slot(
                WEB,
                f"web-{n}",
                [*uvicorn, "--port", str(port), *quiet],
                env | {"ORDERS_RELAY": "1" if n < relays_in_web else "0"},
                logs,
            )
            for n, port in enumerate(self.ports)
        ]
        self.relays = [
            Slot(RELAY, f"relay-{n}", [sys.executable, "-m", "semel", "relay"], env, logs)
            for n in range(relays)
        ]
        self.kills: list[Kill] = []
        self.exits = 0  # restarts of processes that ended by themselves
        self._stopping = False
        on_exit(self.kill_all)

    @property
    def slots(self) -> list[Slot]:
        return [*self.web, *self.relays]

    def start(self) -> None:
        for slot in self.slots:
            slot.start()

    def kill_one(self, kind: str, rng: random.Random) -> Kill | None:
        """SIGKILL a random live process of ``kind`` and start it again."""
        live = [slot for slot in self.slots if slot.kind == kind and slot.alive()]
        if not live:
            return None
        slot = rng.choice(live)
        assert slot.proc is not None
        pid = slot.proc.pid
        slot.kill()
        kill = Kill(kind, pid, time.time())
        self.kills.append(kill)
        slot.start()
        return kill

    def count(self, kind: str) -> int:
        return sum(1 for kill in self.kills if kill.kind == kind)

    async def supervise(self) -> None:
        """Start again what exits by itself, until :meth:`stop`."""
        while not self._stopping:
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    self.exits += 1
                    slot.start()
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = 20.0) -> None:
        """SIGTERM everything (a relay finishes its pass), SIGKILL what is left after ``grace``."""
        self._stopping = True
        for slot in self.slots:
            slot.terminate()
        await asyncio.gather(*(asyncio.to_thread(slot.wait, grace) for slot in self.slots))
        self.kill_all()

    def kill_all(self) -> None:
        self._stopping = True
        for slot in self.slots:
            slot.kill()
