"""A store wrapper that misbehaves on demand, to put the consumer in situations
a healthy server rarely produces: an outage of the embedded store, or a lease
that runs out under a handler because its heartbeats never reach the store.
"""

from __future__ import annotations

import asyncio

from semel.stores.base import JSON, Claim, Outcome, Record, Store
from semel.stores.errors import StoreUnavailable


class FaultyStore(Store):
    """Delegates to ``inner`` unless told to fail."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.backend = inner.backend
        self.down = False
        # (key, fence) claims whose heartbeats never reach the store
        self.muted_heartbeats: set[tuple[str, int]] = set()
        # keys whose first granted claim's heartbeats never reach the store
        self.muted_first: set[str] = set()
        self._first_fences: dict[str, int] = {}
        # keys whose completions take this many seconds to reach the store
        self.slow_completions: dict[str, float] = {}
        self.heartbeats = 0
        # keys whose next claims fail, as many as the count says, while ping
        # still answers: a store that reads but cannot write
        self.failing_claims: dict[str, int] = {}
        self.claims: dict[str, list[Outcome | None]] = {}  # None: the claim failed

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable(self.backend, "cut by the test")

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self._check()
        seen = self.claims.setdefault(key, [])
        if self.failing_claims.get(key, 0) > 0:
            self.failing_claims[key] -= 1
            seen.append(None)
            raise StoreUnavailable(self.backend, "claim cut by the test")
        claim = await self.inner.claim(key, fingerprint)
        seen.append(claim.outcome)
        if claim.outcome is Outcome.CLAIMED:
            self._first_fences.setdefault(key, claim.fence)
        return claim

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        self._check()
        if key in self.slow_completions:
            await asyncio.sleep(self.slow_completions[key])  # a store this slow to answer
        return await self.inner.complete(key, fence, result)

    async def release(self, key: str, fence: int) -> bool:
        self._check()
        return await self.inner.release(key, fence)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        self._check()
        return await self.inner.fail(key, fence, error)

    async def heartbeat(self, key: str, fence: int) -> bool:
        self._check()
        self.heartbeats += 1
        first = key in self.muted_first and self._first_fences.get(key) == fence
        if first or (key, fence) in self.muted_heartbeats:
            return True  # the worker believes its lease was renewed; the store never heard
        return await self.inner.heartbeat(key, fence)

    async def get(self, key: str) -> Record | None:
        self._check()
        return await self.inner.get(key)

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        self._check()
        return await self.inner.reset(key, fingerprint)

    async def migrate(self) -> list[str]:
        return await self.inner.migrate()

    async def ping(self) -> None:
        self._check()
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
