"""A store that times every operation of the store it wraps.

:class:`MeteredStore` is what the worker is given: each call is timed into
``semel_store_operation_duration_seconds``, an unreachable store counts in
``semel_store_errors_total``, a fenced write that was refused in
``semel_fence_rejections_total``. It also remembers when the store last
answered, which is how ``/readyz`` knows the store is reachable without
pinging it while traffic flows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable
from typing import TypeVar

from semel.consumer.ops.metrics import Metrics
from semel.stores.base import JSON, Claim, DelegatingStore, Record, Store
from semel.stores.errors import StoreMisconfigured, StoreUnavailable

T = TypeVar("T")


class Pulse:
    """When the store last answered, and whether that answer was "unreachable"."""

    __slots__ = ("at", "up")

    def __init__(self) -> None:
        self.at = -math.inf  # time.monotonic() of the last answer
        self.up = False

    def beat(self, up: bool) -> float:
        """An answer now; returns now, which the caller's timing ends with."""
        self.at = now = time.monotonic()
        self.up = up
        return now


class MeteredStore(DelegatingStore):
    """Wraps ``inner``; behaves exactly like it, measured."""

    def __init__(self, inner: Store, metrics: Metrics) -> None:
        super().__init__(inner)
        self.pulse = Pulse()
        meters = metrics.store_meters(inner.backend)
        self._duration = meters.duration
        self._errors = meters.errors
        # The two calls of every delivery, their children looked up once.
        self._claim_duration = meters.duration["claim"]
        self._complete_duration = meters.duration["complete"]
        self._complete_rejections = metrics.fence_rejections["complete"]
        self._rejections = metrics.fence_rejections
        self._stopped = metrics.consumption_stopped
        self.stopped_for: str | None = None  # why consumption stopped until a restart

    def consumption_stopped(self, why: str) -> None:
        """Told by the worker when the store's set-up stops consumption for good: what
        ``/readyz``, ``/healthz`` and ``semel_consumption_stopped`` report."""
        self.stopped_for = why
        self._stopped.set(1)

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            result = await call
        except BaseException as exc:
            self._raised(operation, exc, started)
            raise
        self._duration[operation].observe(self.pulse.beat(up=True) - started)
        return result

    def _raised(self, operation: str, exc: BaseException, started: float) -> None:
        """Count a call that raised ``exc``: timed, and told to the pulse unless cancelled."""
        if isinstance(exc, StoreUnavailable | StoreMisconfigured):
            self._errors[operation].inc()
            ended = self.pulse.beat(up=False)
        elif isinstance(exc, Exception):
            ended = self.pulse.beat(up=True)  # it answered, with a refusal (e.g. ResultTooLarge)
        else:
            ended = time.monotonic()
        self._duration[operation].observe(ended - started)

    async def _fenced(self, operation: str, call: Awaitable[bool]) -> bool:
        written = await self._timed(operation, call)
        if not written:
            self._rejections[operation].inc()
        return written

    # claim and complete, every delivery's calls, are _timed and _fenced written
    # out: one coroutine frame and one clock reading less each.
    async def claim(self, key: str, fingerprint: str) -> Claim:
        started = time.monotonic()
        try:
            claim = await self.inner.claim(key, fingerprint)
        except BaseException as exc:
            self._raised("claim", exc, started)
            raise
        self._claim_duration.observe(self.pulse.beat(up=True) - started)
        return claim

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        started = time.monotonic()
        try:
            written = await self.inner.complete(key, fence, result)
        except BaseException as exc:
            self._raised("complete", exc, started)
            raise
        self._complete_duration.observe(self.pulse.beat(up=True) - started)
        if not written:
            self._complete_rejections.inc()
        return written

    async def release(self, key: str, fence: int) -> bool:
        return await self._fenced("release", self.inner.release(key, fence))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._fenced("fail", self.inner.fail(key, fence, error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._fenced("heartbeat", self.inner.heartbeat(key, fence))

    async def get(self, key: str) -> Record | None:
        return await self._timed("get", self.inner.get(key))

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        return await self._timed("reset", self.inner.reset(key, fingerprint))

    async def migrate(self) -> list[str]:
        return await self._timed("migrate", self.inner.migrate())

    async def ping(self) -> None:
        await self._timed("ping", self.inner.ping())
