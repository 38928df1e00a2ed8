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

    def beat(self, up: bool) -> None:
        self.at = time.monotonic()
        self.up = up


class MeteredStore(DelegatingStore):
    """Wraps ``inner``; behaves exactly like it, measured."""

    def __init__(self, inner: Store, metrics: Metrics) -> None:
        super().__init__(inner)
        self.pulse = Pulse()
        meters = metrics.store_meters(inner.backend)
        self._duration = meters.duration
        self._errors = meters.errors
        self._rejections = metrics.fence_rejections
        self._stopped = metrics.consumption_stopped
        self.stopped_for: str | None = None  # why consumption stopped until a restart

    def consumption_stopped(self, why: str) -> None:
        """Told by the worker when the store's set-up stops consumption for good: what
        ``/readyz``, ``/healthz`` and ``semel_consumption_stopped`` report."""
        self.stopped_for = why
        self._stopped.set(1)

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            result = await call
        except (StoreUnavailable, StoreMisconfigured):
            self._errors[operation].inc()
            self.pulse.beat(up=False)
            raise
        except Exception:
            self.pulse.beat(up=True)  # it answered, with a refusal (e.g. ResultTooLarge)
            raise
        finally:
            self._duration[operation].observe(time.perf_counter() - started)
        self.pulse.beat(up=True)
        return result

    async def _fenced(self, operation: str, call: Awaitable[bool]) -> bool:
        written = await self._timed(operation, call)
        if not written:
            self._rejections[operation].inc()
        return written

    async def claim(self, key: str, fingerprint: str) -> Claim:
        return await self._timed("claim", self.inner.claim(key, fingerprint))

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        return await self._fenced("complete", self.inner.complete(key, fence, result))

    async def release(self, key: str, fence: int) -> bool:
        return await self._fenced("release", self.inner.release(key, fence))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._fenced("fail", self.inner.fail(key, fence, error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._fenced("heartbeat", self.inner.heartbeat(key, fence))

    async def get(self, key: str) -> Record | None:
        return await self._timed("get", self.inner.get(key))

    async def reset(self, key: str) -> bool:
        return await self._timed("reset", self.inner.reset(key))

    async def migrate(self) -> list[str]:
        return await self._timed("migrate", self.inner.migrate())

    async def ping(self) -> None:
        await self._timed("ping", self.inner.ping())
