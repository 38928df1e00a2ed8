"""The consumer processes of a chaos run: started, killed or stopped mid-handler, restarted.

Each worker is ``python -m semel`` (or, with the FastStream front door, the
app of :mod:`tests.chaos.faststream_app` on the same environment) in its own
process group with JSON logs in a file of its own; the logs are evidence
later (which delivery of which key settled how). A killed worker is
restarted at once, like a supervisor would; one that exits by itself is
restarted too and counted. A rolling restart SIGTERMs a worker mid-handler
and starts it again once it has exited, as an orchestrator replacing a pod
does.
A worker slot may get environment variables of its own (its own route to the
store, say). Workers run in the checkout this module is in, with it first on
``PYTHONPATH``, so they import its ``semel`` whatever else
is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.ledger import connect, in_flight
from tests.chaos.processes import on_exit
from tests.servers import ROOT

WORKER = "worker"
FASTSTREAM = "faststream"
# What a worker process runs, by front door: semel's own worker, or a FastStream
# app with semel's middleware whose subscriber is the same ledger handler.
FRONTS = {
    WORKER: ("-m", "semel"),
    FASTSTREAM: ("-m", "tests.chaos.faststream_app"),
}
STOP_WAIT = 20.0  # seconds a SIGTERMed worker gets before SIGKILL


@dataclass(frozen=True, slots=True)
class Kill:
    """One SIGKILL: whose, when (wall clock), and what it cut short."""

    pid: int
    at: float
    in_flight: int
    after_effect: bool  # aimed at a handler past its side effect


@dataclass(frozen=True, slots=True)
class Term:
    """One SIGTERM of a rolling restart: whose, when, and how the worker ended."""

    pid: int
    at: float
    in_flight: int
    code: int | None  # its exit code; None: SIGKILLed after STOP_WAIT


@dataclass(frozen=True, slots=True)
class Exit:
    """A worker that ended without being killed by the run."""

    pid: int
    code: int


class Worker:
    """One slot: a consumer process, replaced whenever it dies."""

    def __init__(self, slot: int, env: dict[str, str], logs: Path, front: str = WORKER) -> None:
        self.slot = slot
        self.argv = [sys.executable, *FRONTS[front]]
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.env = env | {"PYTHONPATH": path}
        self.logs = logs
        self.generation = 0
        self.stopping = False  # SIGTERMed by a rolling restart: not a crash to restart
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_files: dict[int, Path] = {}

    def start(self) -> None:
        self.generation += 1
        log = self.logs / f"worker-{self.slot}.{self.generation}.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.log_files[self.proc.pid] = log

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, limit: float) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(limit)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Pool:
    """``count`` workers, a ledger to aim kills with, and the record of what happened."""

    def __init__(
        self,
        count: int,
        env: dict[str, str],
        logs: Path,
        ledger: Path,
        own_env: Mapping[int, Mapping[str, str]] | None = None,
        front: str = WORKER,
    ) -> None:
        """``own_env``: slot -> variables that slot's worker gets on top of ``env``;
        ``front``: what each worker process runs (see :data:`FRONTS`)."""
        logs.mkdir(parents=True, exist_ok=True)
        own = own_env or {}
        self.workers = [
            Worker(slot, env | dict(own.get(slot, {})), logs, front) for slot in range(count)
        ]
        self.ledger = ledger
        # Made now: a kill may look for handlers in flight before any worker has
        # written its first row (a slow start under load), and a read-only open
        # of a file that is not there yet fails.
        connect(ledger).close()
        self.kills: list[Kill] = []
        self.terms: list[Term] = []
        self.exits: list[Exit] = []
        self.restarts = 0
        self._stopping = False
        on_exit(self.kill_all)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    @property
    def log_files(self) -> dict[int, Path]:
        return {pid: path for w in self.workers for pid, path in w.log_files.items()}

    def pids_of(self, slot: int) -> frozenset[int]:
        """Every process that ran in ``slot``, restarts included."""
        return frozenset(self.workers[slot].log_files)

    async def supervise(self) -> None:
        """Restart workers that exit by themselves, until :meth:`stop`."""
        while not self._stopping:
            for worker in self.workers:
                if worker.stopping:
                    continue
                if worker.proc is not None and (code := worker.proc.poll()) is not None:
                    self.exits.append(Exit(worker.pid, code))
                    worker.start()
                    self.restarts += 1
            await asyncio.sleep(0.2)

    async def kill_mid_handler(
        self, rng: random.Random, *, after_effect: bool, deadline: float = 30.0
    ) -> Kill | None:
        """SIGKILL a random worker while the ledger shows one of its handlers running."""
        worker, running = await self._busy_worker(rng, after_effect=after_effect, deadline=deadline)
        return None if worker is None else self._kill(worker, running, after_effect)

    async def term_mid_handler(self, rng: random.Random, *, deadline: float = 30.0) -> Term | None:
        """SIGTERM a random worker while the ledger shows one of its handlers running
        (a rolling restart); start it again once it has exited."""
        worker, running = await self._busy_worker(rng, after_effect=False, deadline=deadline)
        if worker is None:
            return None
        assert worker.proc is not None
        pid, proc = worker.pid, worker.proc
        worker.stopping = True
        try:
            proc.send_signal(signal.SIGTERM)
            at = time.time()
            await asyncio.to_thread(worker.wait, STOP_WAIT)
            code = proc.poll()
            worker.kill()
            if not self._stopping:
                worker.start()
                self.restarts += 1
        finally:
            worker.stopping = False
        term = Term(pid, at, running, code)
        self.terms.append(term)
        return term

    async def _busy_worker(
        self, rng: random.Random, *, after_effect: bool, deadline: float
    ) -> tuple[Worker | None, int]:
        """A random live worker with handlers running (past their effect, if asked)."""
        conn = sqlite3.connect(f"file:{self.ledger}?mode=ro", uri=True, timeout=5)
        end = time.monotonic() + deadline
        try:
            while time.monotonic() < end and not self._stopping:
                candidates = [w for w in self.workers if w.alive() and not w.stopping]
                rng.shuffle(candidates)
                for worker in candidates:
                    with contextlib.suppress(sqlite3.Error):  # the ledger may not exist yet
                        running = in_flight(conn, worker.pid, after_effect=after_effect)
                        if running:
                            return worker, running
                await asyncio.sleep(0.01)
        finally:
            conn.close()
        return None, 0

    async def handlers_running(
        self, count: int, deadline: float, slots: Iterable[int] | None = None
    ) -> bool:
        """Wait until the live workers (of ``slots``) run ``count`` handlers at once."""
        conn = sqlite3.connect(f"file:{self.ledger}?mode=ro", uri=True, timeout=5)
        end = time.monotonic() + deadline
        chosen = self.workers if slots is None else [self.workers[s] for s in slots]
        try:
            while time.monotonic() < end:
                pids = [w.pid for w in chosen if w.alive()]
                with contextlib.suppress(sqlite3.Error):
                    if sum(in_flight(conn, pid, after_effect=False) for pid in pids) >= count:
                        return True
                await asyncio.sleep(0.02)
        finally:
            conn.close()
        return False

    def _kill(self, worker: Worker, running: int, after_effect: bool) -> Kill:
        pid = worker.pid
        worker.kill()
        # Timed once the process is gone (kill() waits for it): an effect the
        # worker recorded while the signal was on its way is before the kill.
        kill = Kill(pid, time.time(), running, after_effect)
        self.kills.append(kill)
        worker.start()
        self.restarts += 1
        return kill

    async def stop(self) -> None:
        """SIGTERM every worker (they finish or hand back what they hold), then SIGKILL."""
        self._stopping = True
        for worker in self.workers:
            if worker.proc is not None and worker.alive():
                worker.proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(asyncio.to_thread(w.wait, STOP_WAIT) for w in self.workers))
        self.kill_all()

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()
