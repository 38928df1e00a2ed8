"""Watching the two servers a worker depends on.

The store: when a delivery finds it unreachable, consumption pauses (the
queue's consumer is cancelled, so the broker keeps the messages) and the
store is pinged with a growing pause until it answers; then consumption
resumes by itself. The broker: aio-pika's robust connection reconnects, and
:class:`semel.consumer.broker.intake.Intake` consumes again; this module only decides when
it has been away too long and the process should exit for its supervisor to
restart it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

import structlog
from aio_pika.abc import AbstractConnection

from semel.consumer.backoff import Backoff
from semel.consumer.broker.intake import Intake
from semel.stores.base import Store
from semel.stores.errors import StoreUnavailable

PROBE_BACKOFF = (0.2, 5.0)  # first and longest pause between store pings
# A store that stayed usable this long after consumption resumed has recovered:
# the next outage starts its pings from the first pause again.
RECOVERED_AFTER = 2 * PROBE_BACKOFF[1]
BROKER_CHECK_INTERVAL = 1.0

log = structlog.get_logger("semel.supervise")


@runtime_checkable
class ReportsStop(Protocol):
    """A store that tells operations (readiness, a metric) consumption has stopped."""

    def consumption_stopped(self, why: str) -> None: ...


def announce_stop(store: Store, why: str) -> None:
    """Let readiness and metrics know, through the worker's store, that consumption
    stopped until a restart: a worker that does nothing must not look healthy."""
    if isinstance(store, ReportsStop):
        store.consumption_stopped(why)


async def ping_until_up(store: Store, backoff: Backoff) -> None:
    """Return once the store answers (never at once: a store whose ping passes
    while its real calls fail would otherwise flap consumption on and off)."""
    while True:
        waited = await backoff.wait()
        try:
            await store.ping()
            return
        except StoreUnavailable as exc:
            log.warning("store unreachable, consumption paused", error=str(exc), retry_in=waited)


class StoreGate:
    """Closed while the store is unreachable; deliveries then go straight back.

    A store that answers but is not set up for semel (a table missing, a
    permission denied) closes the gate for good: a ping would pass and
    consumption would flap on and off, handing every message back each time.
    The operator fixes the store and restarts the worker.
    """

    def __init__(self, store: Store, intake: Intake) -> None:
        self._store = store
        self._intake = intake
        self._down = asyncio.Event()
        self.stopped_for: str | None = None  # why consumption stopped for good
        # Kept across pauses: a store whose ping passes while its writes fail
        # pauses consumption again at once, and each round must wait longer.
        self._backoff = Backoff(*PROBE_BACKOFF)
        self._resumed_at = -RECOVERED_AFTER

    @property
    def open(self) -> bool:
        return not self._down.is_set()

    def report_down(self) -> None:
        self._down.set()

    def stop(self, why: str) -> None:
        """Stop consuming until the process restarts; says why once."""
        if self.stopped_for is None:
            self.stopped_for = why
            log.error("store misconfigured: consumption stopped until restart", error=why)
            announce_stop(self._store, why)
        self._down.set()

    async def watch(self, stopping: asyncio.Event) -> None:
        """Pause on a report, resume when the store answers; until ``stopping``."""
        while not stopping.is_set():
            await self._down.wait()
            await self._intake.pause()
            if self.stopped_for is not None:
                await stopping.wait()
                return
            if time.monotonic() - self._resumed_at >= RECOVERED_AFTER:
                self._backoff.reset()
            await ping_until_up(self._store, self._backoff)
            if stopping.is_set():
                return
            # Open before attaching, or the first deliveries would bounce off.
            self._down.clear()
            try:
                await self._intake.resume()
            except Exception as exc:  # the broker may be away too: try again
                self._down.set()
                log.warning("consumption not resumed, retrying", error=repr(exc))
                await asyncio.sleep(PROBE_BACKOFF[1])
                continue
            self._resumed_at = time.monotonic()
            log.info("store reachable again, consumption resumed")


async def broker_gone_for(connection: AbstractConnection, give_up: float) -> float:
    """Return once the connection has been down longer than ``give_up`` seconds."""
    interval = min(BROKER_CHECK_INTERVAL, give_up / 4)
    away_since: float | None = None
    while True:
        if connection.connected.is_set():
            away_since = None
        else:
            if away_since is None:
                away_since = time.monotonic()
                log.warning("broker connection lost, reconnecting", give_up_after=give_up)
            if time.monotonic() - away_since > give_up:
                return time.monotonic() - away_since
        await asyncio.sleep(interval)
