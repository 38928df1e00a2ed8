"""Stand-ins for the unit tests: a store, a message and a connection, no servers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from semel.consumer.delivery.facts import Delivery, Facts, Origin
from semel.stores.base import JSON, Claim, Outcome, Record, Status, Store, StoreConfig
from semel.stores.errors import StoreUnavailable


def record(*, fence: int = 1, claims: int = 1) -> Record:
    return Record(
        key="k", fingerprint="f", status=Status.IN_PROGRESS, fence=fence, claims=claims,
        lease_expires_at=None,
    )  # fmt: skip


def claim(outcome: Outcome = Outcome.CLAIMED, *, fence: int = 1, claims: int = 1) -> Claim:
    return Claim(outcome, record(fence=fence, claims=claims))


class ScriptedStore(Store):
    """Answers as told: ``down`` raises StoreUnavailable, ``hang`` never answers a ping."""

    backend = "scripted"

    def __init__(self) -> None:
        super().__init__(StoreConfig())
        self.down = False
        self.hang = False
        self.fenced_out = False  # fenced writes answer False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable(self.backend, "down for the test")

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self._check()
        return claim()

    async def _fenced(self) -> bool:
        self._check()
        return not self.fenced_out

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        return await self._fenced()

    async def release(self, key: str, fence: int) -> bool:
        return await self._fenced()

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._fenced()

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._fenced()

    async def get(self, key: str) -> Record | None:
        self._check()
        return None

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        self._check()
        return False

    async def migrate(self) -> list[str]:
        return []

    async def ping(self) -> None:
        if self.hang:
            await asyncio.Event().wait()
        self._check()

    def purge(self) -> str:
        """A backend-specific extra, beyond the contract."""
        return "purged"


@dataclass
class StubMessage:
    """The attributes of an incoming message that observers read."""

    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b"{}"
    exchange: str = "orders"
    routing_key: str = "order.paid"
    message_id: str | None = "m-1"
    correlation_id: str | None = None
    delivery_tag: int | None = 7


def message(**fields: Any) -> AbstractIncomingMessage:
    return cast(AbstractIncomingMessage, StubMessage(**fields))


def delivery(key: str | None = "k", *, attempt: int = 1, fence: int | None = 1) -> Delivery:
    facts = Facts(key=key, attempt=attempt, origin=Origin("orders", "order.paid"), first_seen="")
    return Delivery(message(), facts, headers={}, started=0.0, fence=fence)


class StubConnection:
    """An aio-pika connection as far as readiness looks at it."""

    def __init__(self) -> None:
        self.is_closed = False
        self.connected = asyncio.Event()


def connection(stub: StubConnection) -> AbstractConnection:
    return cast(AbstractConnection, stub)
