"""Where a cluster run's workers are: beside which node, connected to which.

A worker is a chaos-run worker (:class:`tests.chaos.workers.Worker`), run
either on the host or inside a node's network namespace, beside that node:
a partition then cuts it off with its node, from the other nodes and from
the store, as it would a consumer in the node's own rack or zone.

Each worker serves ``/readyz`` on a port of its own, which names the node it
is connected to. Consumers shuffle their addresses, so a run that needs a
worker on a given node restarts it (SIGTERM, start again) until it lands
there, before any message is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from tests.chaos.workers import Pool, Worker
from tests.servers import ROOT

HTTP_TIMEOUT = 2.0
PLACEMENT_DEADLINE = 120.0


class BesideNode(Worker):
    """A worker started in a node's network namespace (``prefix``: ``ip netns exec NS``)."""

    def __init__(self, worker: Worker, prefix: list[str]) -> None:
        super().__init__(worker.slot, worker.env, worker.logs)
        self.prefix = prefix

    def start(self) -> None:
        self.generation += 1
        log = self.logs / f"worker-{self.slot}.{self.generation}.log"
        with log.open("ab") as out:
            # `ip netns exec` execs the command: the pid is the consumer's own.
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "semel"],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.log_files[self.proc.pid] = log


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a worker's ``/readyz`` and ``/metrics`` answer."""

    host: str
    port: int

    async def get(self, path: str) -> tuple[int, bytes] | None:
        """Status and body, or None when nothing answers in time."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), HTTP_TIMEOUT
            )
        except (OSError, TimeoutError):
            return None
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
            raw = await asyncio.wait_for(reader.read(), HTTP_TIMEOUT)
        except (OSError, TimeoutError):
            return None
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        try:
            return int(head.split(b" ", 2)[1]), body
        except (IndexError, ValueError):
            return None

    async def node(self) -> str | None:
        """The broker node the worker is connected to, from ``/readyz``."""
        answer = await self.get("/readyz")
        if answer is None:
            return None
        node: str | None = orjson.loads(answer[1]).get("node")
        return node

    async def metric(self, name: str) -> float | None:
        answer = await self.get("/metrics")
        if answer is None:
            return None
        for line in answer[1].decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


async def restart(worker: Worker) -> None:
    """Stop a worker the way its supervisor would (SIGTERM), and start it again."""
    if worker.proc is not None and worker.alive():
        worker.proc.terminate()
        await asyncio.to_thread(worker.wait, 20)
        worker.kill()
    worker.start()


async def place(
    pool: Pool,
    endpoints: Mapping[int, Endpoint],
    wanted: Mapping[int, frozenset[str]],
    deadline: float = PLACEMENT_DEADLINE,
) -> tuple[dict[int, str], int]:
    """Restart workers until each slot of ``wanted`` is on one of its nodes.

    Returns each slot's node and how many restarts it took.
    """
    end = time.monotonic() + deadline
    restarts = 0
    while True:
        for slot in endpoints:
            worker = pool.workers[slot]
            if not worker.alive():
                log = worker.log_files[worker.pid].read_text(errors="replace")
                raise RuntimeError(f"worker {slot} exited while being placed:\n{log[-2000:]}")
        nodes = {slot: await endpoints[slot].node() for slot in endpoints}
        wrong = [s for s, node in nodes.items() if node is not None and node not in wanted[s]]
        if all(node is not None for node in nodes.values()) and not wrong:
            return {slot: str(node) for slot, node in nodes.items()}, restarts
        if time.monotonic() > end:
            raise RuntimeError(f"workers not placed after {deadline:g}s: {nodes}, wanted {wanted}")
        await asyncio.gather(*(restart(pool.workers[slot]) for slot in wrong))
        restarts += len(wrong)
        await asyncio.sleep(0.3)


async def until_moved(endpoint: Endpoint, away_from: str, deadline: float) -> float | None:
    """Seconds until the worker is connected to a node other than ``away_from``; None: never."""
    began = time.monotonic()
    while time.monotonic() - began < deadline:
        node = await endpoint.node()
        if node is not None and node != away_from:
            return time.monotonic() - began
        await asyncio.sleep(0.25)
    return None


async def failovers(endpoints: Mapping[int, Endpoint]) -> dict[int, float | None]:
    """``semel_broker_failovers_total`` of each worker (None: it did not answer)."""
    found = {}
    for slot, endpoint in endpoints.items():
        with contextlib.suppress(ValueError):
            found[slot] = await endpoint.metric("semel_broker_failovers_total")
    return found
