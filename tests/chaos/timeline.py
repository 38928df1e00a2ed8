"""The faults of one chaos run, each started at its moment of the flow.

The timeline is laid out over the expected publishing time ``flow`` (see
:mod:`tests.chaos.run`); each fault kind's method waits for its share of it
and records the wall-clock windows the store was away, which the verdict
uses to explain handed-back deliveries.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from tests.chaos.faults import STALLED_SLOT
from tests.chaos.producer import Gate
from tests.chaos.rabbit import RabbitNode
from tests.chaos.servers import PrivateRedis, PrivateRedisTopology, StoreServer
from tests.chaos.verdict import Window
from tests.chaos.workers import Pool
from tests.proxy import TcpProxy

if TYPE_CHECKING:
    from tests.chaos.run import ChaosConfig

log = logging.getLogger("semel.chaos")


class Timeline:
    """The faults, started at their moments of the flow, with their wall-clock windows."""

    def __init__(self, config: ChaosConfig, flow: float, rng: random.Random) -> None:
        self.config, self.flow, self.rng = config, flow, rng
        # Wall-clock windows the store was away, and the worker slot cut off (None: all).
        self.outages: list[tuple[float, float, int | None]] = []
        self.detail = ""
        self.started = time.monotonic()

    def windows(self, pool: Pool) -> list[Window]:
        return [
            Window(start, end, None if slot is None else pool.pids_of(slot))
            for start, end, slot in self.outages
        ]

    async def _at(self, share: float) -> None:
        await asyncio.sleep(max(0.0, self.started + share * self.flow - time.monotonic()))

    async def kills(self, pool: Pool, flowing: asyncio.Future[Any] | None = None) -> None:
        """``kills`` SIGKILLs spread over 10-85 % of the expected flow; with
        ``kill_every``, one every that many seconds from 10 % of it until
        ``flowing`` (the producer) is done, however long a fault held the flow up."""
        every = self.config.kill_every
        if every > 0 and flowing is not None:
            await self._kill_every(pool, every, flowing)
            return
        count = self.config.kills
        for n in range(count):
            await self._at(0.1 + 0.75 * n / max(1, count - 1))
            await self._kill(pool, n)

    async def _kill_every(self, pool: Pool, every: float, flowing: asyncio.Future[Any]) -> None:
        await self._at(0.1)
        n = 0
        while not flowing.done():
            began = time.monotonic()
            # A kill that finds no handler within the period (the broker away) is skipped.
            await self._kill(pool, n, deadline=every)
            n += 1
            wait = max(0.0, began + every - time.monotonic())
            await asyncio.wait({flowing}, timeout=wait)

    async def _kill(self, pool: Pool, n: int, deadline: float = 30.0) -> None:
        # Two in three aim past the effect: those are the kills that can duplicate it.
        kill = await pool.kill_mid_handler(self.rng, after_effect=n % 3 != 2, deadline=deadline)
        if kill is None:
            log.warning("kill %d: no handler in flight to cut short", n + 1)
        else:
            log.info("kill %d: pid %d, %d handlers in flight", n + 1, kill.pid, kill.in_flight)

    def rolling_gates(self) -> list[tuple[Gate, str]]:
        """The rolling restarts' SIGTERMs and the run's SIGKILLs between them, each
        at a share of the originals that the producer holds at until it has run."""
        config = self.config
        moments = sorted(
            [(0.1 + 0.75 * n / max(1, config.terms - 1), "term") for n in range(config.terms)]
            + [(0.15 + 0.7 * n / max(1, config.kills - 1), "kill") for n in range(config.kills)]
        )
        return [(Gate(share), what) for share, what in moments]

    async def rolling(self, pool: Pool, gates: list[tuple[Gate, str]]) -> None:
        """SIGTERMs mid-handler (rolling restarts), with the run's SIGKILLs between them."""
        for n, (gate, what) in enumerate(gates):
            await gate.reached.wait()
            try:
                await self._rolling_fault(pool, n, what)
            finally:
                gate.passed.set()

    async def _rolling_fault(self, pool: Pool, n: int, what: str) -> None:
        if what == "kill":
            kill = await pool.kill_mid_handler(self.rng, after_effect=n % 2 == 0)
            if kill is None:
                log.warning("kill: no handler in flight to cut short")
        else:
            term = await pool.term_mid_handler(self.rng)
            if term is None:
                log.warning("rolling restart: no handler in flight to cut short")
            else:
                log.info("rolling restart: pid %d, %d handlers in flight, exit %s",
                         term.pid, term.in_flight, term.code)  # fmt: skip

    async def broker_and_store(self, node: RabbitNode, server: StoreServer, pool: Pool) -> None:
        if isinstance(server, PrivateRedisTopology):
            # A failover is the store fault of its own: no broker restart before it,
            # which would hold the flow back until it is nearly over.
            await self._failover(server, pool)
            return
        await self._at(0.3)
        log.info("broker: stop_app")
        await node.restart(self.config.broker_down)
        log.info("broker: started again")
        if server.can_fail:
            await self._at(0.6)
            # Right after the broker restart the workers are still reconnecting:
            # an outage then would meet no handler. Wait for the flow to be back.
            running = self.config.outage_when_running
            if not await pool.handlers_running(running, 15):
                log.warning("store outage starts with fewer than %d handlers running", running)
            log.info("store: outage of %gs begins", self.config.outage)
            began = time.time()
            await server.outage(self.config.outage)
            self.outages.append((began, time.time(), None))
            log.info("store: back")

    async def _failover(self, server: PrivateRedisTopology, pool: Pool) -> None:
        """The primary SIGKILLed at half the flow, while handlers run; healed after."""
        await self._at(0.5)
        # At a light rate few handlers run at once: wait for two at most, and not
        # longer than a tenth of the flow, so the kill still lands inside it.
        running = min(2, self.config.outage_when_running)
        if not await pool.handlers_running(running, max(1.0, self.flow / 10)):
            log.warning("the primary dies with fewer than %d handlers running", running)
        log.info("store: the primary is SIGKILLed")
        began = time.time()
        await server.outage(0.0)
        # Until the old primary is back as a replica, writes waiting for one fail.
        self.outages.append((began, time.time(), None))
        failover = server.failovers[-1]
        log.info("store: promoted after %.1fs, old primary back as replica",
                 failover.promoted - failover.killed)  # fmt: skip

    async def fill_up(self, server: StoreServer, pool: Pool) -> None:
        """A Redis that fills up: writes refused with ``OOM`` for ``outage`` seconds."""
        assert isinstance(server, PrivateRedis)
        await self._at(self.config.fault_at)
        running = self.config.outage_when_running
        if not await pool.handlers_running(running, 15):
            log.warning("store fills up with fewer than %d handlers running", running)
        log.info("store: full (maxmemory at used_memory, noeviction) for %gs", self.config.outage)
        began = time.time()
        refused = await server.fill_up(self.config.outage)
        self.outages.append((began, time.time(), None))
        self.detail = f"writes refused for {self.config.outage:g}s: {refused} OOM replies"
        log.info("store: room again after %d OOM replies", refused)

    async def blackhole(self, proxy: TcpProxy, pool: Pool) -> None:
        """Worker ``STALLED_SLOT``'s link to the store stalls for ``stall`` seconds."""
        await self._at(self.config.fault_at)
        running = max(1, self.config.outage_when_running // 4)
        if not await pool.handlers_running(running, 15, slots=[STALLED_SLOT]):
            log.warning("the link stalls with fewer than %d handlers running behind it", running)
        log.info("store: worker %d's link stalls for %gs", STALLED_SLOT, self.config.stall)
        began = time.time()
        proxy.stall()
        try:
            await asyncio.sleep(self.config.stall)
        finally:
            proxy.resume()
        self.outages.append((began, time.time(), STALLED_SLOT))
        self.detail = (
            f"worker {STALLED_SLOT}'s link stalled {self.config.stall:g}s "
            f"(lease {self.config.lock_ttl:g}s), others direct"
        )
        log.info("store: worker %d's link flows again", STALLED_SLOT)
