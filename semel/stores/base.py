"""The store contract: what every idempotency backend promises.

The state machine of one key, shared by every backend::

    (absent) --claim--> in_progress(fence=clock, claims=1)
    in_progress --complete(fence)--> completed      (result kept for retention)
    in_progress --fail(fence)------> failed         (terminal, remembered)
    in_progress --release(fence)---> in_progress with an expired lease
    in_progress, lease expired --claim--> in_progress(fence+1, claims+1)
    in_progress, lease expired, claims >= max_claims --claim--> failed("poison")
    completed/failed past retention  --claim--> as if absent, fence still grows
                                                where the record still exists:
                                                max(fence + 1, clock)

A key's fence only grows, even across a forgotten record (retention, purge,
eviction, a TTL sweep): a claim with no record starts it at the store's clock
in microseconds since the Unix epoch ("clock" above), and each takeover adds
one. A takeover waits for a lapsed lease or a release, a store round trip at
the very least, so one per takeover never catches up with a clock gaining a
million a second, and a forgotten key's next fence is above every fence it
had. The clock is the server's where there is one (PostgreSQL, Redis), the
host's for SQLite and the claiming worker's for DynamoDB. What this rests on:
that clock not going back across the gap (an NTP step, a failover to a host
whose clock is behind; for DynamoDB, skew between workers) by more than the
time since the key's first claim.

A claim is decided by the store in ONE atomic step against the store's own
clock where it has one, and it returns the record it claimed or collided with,
so the caller never needs a second read. Every write after a claim names the
fence it was granted; a write whose fence is no longer the owner's changes
nothing and returns ``False``.

"Expired" is derived from timestamps at decision time, never stored.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Self, TypeVar

from semel.stores.codec import dump_result
from semel.stores.errors import KeyRefused, ResultTooLarge

T = TypeVar("T")

JSON = Any
"""A JSON-serialisable value (dict, list, str, int, float, bool or None)."""

POISON_ERROR = "poison: claimed too many times without completing"


class Status(StrEnum):
    """What is stored for a key."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class Outcome(StrEnum):
    """What a claim attempt decided."""

    CLAIMED = "claimed"  # the caller owns the key now, under record.fence
    DUPLICATE = "duplicate"  # completed before; record.result is the stored result
    IN_PROGRESS = "in_progress"  # a live lease is held; record.lease_expires_at says until when
    MISMATCH = "mismatch"  # same key, different fingerprint; nothing written
    POISON = "poison"  # too many claims without completion; the key is now failed
    FAILED = "failed"  # failed terminally before; nothing written


@dataclass(frozen=True, slots=True)
class Record:
    """One key's stored state, as a backend read or wrote it."""

    key: str
    fingerprint: str
    status: Status
    fence: int
    claims: int
    lease_expires_at: datetime | None
    result: JSON = None
    error: str | None = None
    first_seen: datetime | None = None
    updated_at: datetime | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to :meth:`Store.claim`: the decision and the record behind it."""

    outcome: Outcome
    record: Record

    @property
    def fence(self) -> int:
        return self.record.fence


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One key to claim in :meth:`Store.claim_many`."""

    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Completion:
    """One completion in :meth:`Store.complete_many`; ``data`` from :meth:`Store.encode_result`."""

    key: str
    fence: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Backend-independent knobs, all in seconds."""

    lock_ttl: float = 30.0
    retention: float = 86_400.0
    max_claims: int = 10
    key_prefix: str = "semel"

    @property
    def call_deadline(self) -> float:
        """Seconds any one store call may take: a third of the lease, the interval
        of its heartbeats. A claim answered later than this is given up by the
        consumer anyway, and a heartbeat sent this late still lands in the lease."""
        return self.lock_ttl / 3

    def namespaced(self, key: str) -> str:
        """The key as stored: prefixed so services sharing one store never collide."""
        return f"{self.key_prefix}:{key}"


class Store(abc.ABC):
    """An idempotency store. Subclasses translate the contract into one backend.

    What a backend's failures become (every backend sorts its server's
    errors into these, and nothing else escapes for infrastructure trouble):

    - :class:`semel.stores.errors.StoreUnavailable`: unreachable, or a condition that
      passes (full, read-only after a failover, loading, throttled, a lock or
      statement timeout): the consumer waits for the store and loses nothing;
    - :class:`semel.stores.errors.StoreMisconfigured`: reachable but not set up for
      semel (a missing table, a permission denied): stop and say so;
    - :class:`semel.stores.errors.KeyRefused`: this one key cannot be held; in a
      batch, that key's answer is the error and the other keys are decided.
    """

    backend: str = "abstract"
    result_limit: int | None = None  # bytes of encoded result the backend can hold

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    def encode_result(self, result: JSON) -> bytes:
        """``result`` as this store writes it (:func:`semel.stores.codec.dump_result`: common
        Python values in their JSON form); raises what :meth:`complete` documents.

        Refused whole rather than truncated when it exceeds :attr:`result_limit`.
        """
        data = dump_result(result)
        if self.result_limit is not None and len(data) > self.result_limit:
            raise ResultTooLarge(len(data), self.result_limit)
        return data

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        """Claim several distinct keys; the answers of one :meth:`claim` each, in order.

        Backends override it to decide the whole batch in one round trip; each
        key is still decided atomically on its own, and a key the store cannot
        hold answers :class:`KeyRefused` without failing the others. Keys in
        one call are distinct (the caller guarantees it). Raises
        :class:`semel.stores.errors.StoreUnavailable` for the batch as a whole.
        """
        answers: list[Claim | KeyRefused] = []
        for request in requests:
            try:
                answers.append(await self.claim(request.key, request.fingerprint))
            except KeyRefused as refused:
                answers.append(refused)
        return answers

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        """Complete several distinct keys, each fenced on its own; answers in order.

        A backend overrides this or :meth:`complete_encoded` (or both); each
        default is written in terms of the other.
        """
        if type(self).complete_encoded is Store.complete_encoded:
            raise NotImplementedError(f"{self.backend} store completes only through complete()")
        answers: list[bool | KeyRefused] = []
        for completion in completions:
            try:
                answers.append(await self.complete_encoded(completion))
            except KeyRefused as refused:
                answers.append(refused)
        return answers

    async def complete_encoded(self, completion: Completion) -> bool:
        """:meth:`complete` with a result already encoded by :meth:`encode_result`;
        by default a batch of one."""
        return answer_of((await self.complete_many([completion]))[0])

    async def claim(self, key: str, fingerprint: str) -> Claim:
        """Try to take ``key`` for this worker in one atomic step; by default a batch of one.

        A backend overrides this or :meth:`claim_many` (or both); each default
        is written in terms of the other.
        """
        if type(self).claim_many is Store.claim_many:
            raise NotImplementedError(f"{self.backend} store claims only through claim_many()")
        return answer_of((await self.claim_many([ClaimRequest(key, fingerprint)]))[0])

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        """Mark the key completed with ``result``; ``False`` if ``fence`` lost the key.

        Raises :class:`semel.stores.errors.ResultTooLarge` when the backend cannot
        hold ``result``, and ``orjson.JSONEncodeError`` when it has no JSON form
        (:meth:`encode_result`); the key is then left as it was.
        """
        return await self.complete_encoded(Completion(key, fence, self.encode_result(result)))

    @abc.abstractmethod
    async def release(self, key: str, fence: int) -> bool:
        """Give the claim up so the next claim gets in at once (lease expired)."""

    @abc.abstractmethod
    async def fail(self, key: str, fence: int, error: str) -> bool:
        """Mark the key failed terminally, remembered for the retention period."""

    @abc.abstractmethod
    async def heartbeat(self, key: str, fence: int) -> bool:
        """Extend a running lease by ``lock_ttl`` from now.

        ``False`` if taken over, or if the lease is over (its worker released
        it, or it lapsed): a heartbeat landing after its own release must not
        hold the key again for nobody.
        """

    @abc.abstractmethod
    async def get(self, key: str) -> Record | None:
        """The key's record, or ``None`` when absent or past retention."""

    @abc.abstractmethod
    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        """Forget a failed key's outcome so it runs again (DLQ replay).

        Only a failed key is reset, poison included (marked failed, or in
        progress with its claims used up and no lease); its claims start
        again. A completed key stays completed, so a replayed copy of it is a
        duplicate, and a claim in hand keeps its lease. The fence is kept
        where the backend can keep it, so fences stay monotonic for
        downstream systems. ``False`` when the key is absent or not failed.

        ``fingerprint``, when given, replaces the record's in the same write:
        the key then runs again with an edited body (a dead letter fixed by
        hand and replayed under its key), and a claim with the old body is
        the mismatch. ``None`` keeps the record's. A key not reset keeps its
        fingerprint whatever is given.
        """

    @abc.abstractmethod
    async def migrate(self) -> list[str]:
        """Create table / index / TTL settings; safe to run twice.

        Returns warnings for the operator (e.g. a server without a TTL API).
        """

    async def warnings(self) -> list[str]:
        """What the operator should know of the server's set-up (no persistence, an
        evicting memory policy): said by ``semel migrate`` and logged at start-up."""
        return []

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise :class:`semel.stores.errors.StoreUnavailable` unless the backend answers."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the container calls it at shutdown."""

    async def __aenter__(self) -> Self:
        # Already open: ``async with await open_store(url) as store:`` only closes it.
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


def answer_of(answer: T | KeyRefused) -> T:
    """One key's answer from a batch: the value, or its refusal raised."""
    if isinstance(answer, KeyRefused):
        raise answer
    return answer


class DelegatingStore(Store):
    """A store that hands every call to ``inner``; a wrapper overrides what it changes.

    The consumer wraps its store twice (batching, metering), and tests wrap it
    to inject faults: each wrapper is then only what it adds. Backend extras
    (the PostgreSQL store's purge, say) stay reachable through any wrapper.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.backend = inner.backend
        self.result_limit = inner.result_limit
        if type(self).encode_result is DelegatingStore.encode_result:
            # The backend's own, bound here: a result is encoded on every completion,
            # and through the consumer's wrappers it was a call per wrapper.
            self.encode_result = inner.encode_result  # type: ignore[method-assign]

    def encode_result(self, result: JSON) -> bytes:
        return self.inner.encode_result(result)  # the backend may refuse more than size

    async def claim(self, key: str, fingerprint: str) -> Claim:
        return await self.inner.claim(key, fingerprint)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        return await self.inner.claim_many(requests)

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        return await self.inner.complete(key, fence, result)

    async def complete_encoded(self, completion: Completion) -> bool:
        return await self.inner.complete_encoded(completion)

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        return await self.inner.complete_many(completions)

    async def release(self, key: str, fence: int) -> bool:
        return await self.inner.release(key, fence)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self.inner.fail(key, fence, error)

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self.inner.heartbeat(key, fence)

    async def get(self, key: str) -> Record | None:
        return await self.inner.get(key)

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        return await self.inner.reset(key, fingerprint)

    async def migrate(self) -> list[str]:
        return await self.inner.migrate()

    async def warnings(self) -> list[str]:
        return await self.inner.warnings()

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks: the backend's own extras.
        return getattr(self.inner, name)
