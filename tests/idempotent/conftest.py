"""Fixtures of the decorator's tests: the stores a decorated function is given,
one per retention as a caller would cache them, and wrappers that count the
calls reaching the store or keep heartbeats from it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from semel.stores.base import JSON, Claim, DelegatingStore, Store
from tests.conftest import StoreFactory

# Every backend once (the store contract suite runs the second DynamoDB server).
IDEMPOTENT_BACKENDS = ["sqlite", "postgres", "redis", "dynamodb-moto"]
# A lease short enough for a test to wait one out, long enough that a loaded
# two-core machine does not lose a kept one between two heartbeats.
SHORT_LEASE = 1.5


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> str:
    """The store under test; a ``parametrize("backend", ...)`` overrides it (autouse, so
    ``make_settings``, which looks it up by name, sees it in every test)."""
    name: str = getattr(request, "param", "sqlite")
    return name


class Counting(DelegatingStore):
    """Counts the calls that reach the store, by method."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self.calls["claim"] += 1
        return await self.inner.claim(key, fingerprint)

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        self.calls["complete"] += 1
        return await self.inner.complete(key, fence, result)

    async def heartbeat(self, key: str, fence: int) -> bool:
        self.calls["heartbeat"] += 1
        return await self.inner.heartbeat(key, fence)

    async def release(self, key: str, fence: int) -> bool:
        self.calls["release"] += 1
        return await self.inner.release(key, fence)


class Unrenewed(DelegatingStore):
    """Heartbeats answered "renewed" without reaching the store while ``cut``: the
    lease lapses at the store, unknown to its holder, as behind a stalled network."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.cut = True

    async def heartbeat(self, key: str, fence: int) -> bool:
        return True if self.cut else await self.inner.heartbeat(key, fence)


class Counted:
    """A ``wrap`` that counts, keeping the stores it wrapped."""

    def __init__(self) -> None:
        self.stores: list[Counting] = []

    def __call__(self, store: Store) -> Counting:
        self.stores.append(Counting(store))
        return self.stores[-1]


class Stores:
    """``store_for``: stores of the backend under test, one per retention, each
    opened on first use and wrapped by ``wrap``."""

    def __init__(
        self, make_store: StoreFactory, wrap: Callable[[Store], Store], overrides: dict[str, Any]
    ) -> None:
        self._make_store = make_store
        self._wrap = wrap
        self._overrides = overrides
        self.opened: dict[float | None, Store] = {}

    async def __call__(self, retention: float | None) -> Store:
        if retention not in self.opened:
            extra = {} if retention is None else {"retention": retention}
            store = await self._make_store(**self._overrides, **extra)
            self.opened[retention] = self._wrap(store)
        return self.opened[retention]


StoresFactory = Callable[..., Stores]


@pytest.fixture
def make_stores(make_store: StoreFactory) -> StoresFactory:
    """``make_stores(wrap=..., **settings)``: a ``store_for`` (``make_store`` closes the stores)."""

    def factory(wrap: Callable[[Store], Store] = lambda store: store, **overrides: Any) -> Stores:
        return Stores(make_store, wrap, overrides)

    return factory


@pytest.fixture
async def store_for(make_stores: StoresFactory) -> Callable[[float | None], Awaitable[Store]]:
    return make_stores()
