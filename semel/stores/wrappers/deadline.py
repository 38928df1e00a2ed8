"""Every store call answers within a deadline, or counts as the store being down.

A connection whose packets are dropped on the way (a blackholed route, a
firewall that forgot the flow, a peer that froze) gives no error: the
client's bytes are acknowledged by nobody, or by a middlebox, and the call
waits for its client's own timeouts, which are often long or absent. A
worker cannot wait that long with a key claimed: its lease runs out, another
worker takes the key over, and nothing in this process notices.

:class:`DeadlineStore` bounds each call. Past the deadline the caller gets
:class:`StoreUnavailable` at once, so the delivery takes the outage path. The
call itself is *abandoned*, not cancelled: cancelling a call in flight tells
nobody whether it landed (and a client's clean-up on cancellation can itself
take seconds: psycopg sends the server a cancel request and waits for it).
Left to finish in the background, bounded by its client's own timeouts, a
claim that lands after all is released at once, so the key is free again
instead of held by nobody until its lease runs out. Every other write is
fenced, so a late one changes nothing its owner did not mean to.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from semel.stores.base import (
    JSON,
    Claim,
    ClaimRequest,
    Completion,
    DelegatingStore,
    Outcome,
    Record,
    Store,
)
from semel.stores.errors import KeyRefused, StoreError, StoreUnavailable

T = TypeVar("T")


class DeadlineStore(DelegatingStore):
    """``inner`` with every call bounded by ``deadline`` seconds (by default the
    store's :attr:`~semel.stores.base.StoreConfig.call_deadline`)."""

    def __init__(self, inner: Store, deadline: float | None = None) -> None:
        super().__init__(inner)
        self.deadline = inner.config.call_deadline if deadline is None else deadline
        self._abandoned: set[asyncio.Task[Any]] = set()

    async def _bounded(
        self, call: Coroutine[Any, Any, T], late: Callable[[T], None] | None = None
    ) -> T:
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.deadline)
        except asyncio.CancelledError:
            self._abandon(task, late)
            raise
        if not done:
            self._abandon(task, late)
            raise StoreUnavailable(self.backend, f"no answer within {self.deadline:g}s")
        return task.result()

    def _abandon(self, task: asyncio.Task[T], late: Callable[[T], None] | None) -> None:
        # Kept referenced until it ends, and its outcome retrieved: nobody awaits it.
        self._abandoned.add(task)

        def ended(task: asyncio.Task[T]) -> None:
            self._abandoned.discard(task)
            if task.cancelled() or task.exception() is not None:
                return
            if late is not None:
                late(task.result())

        task.add_done_callback(ended)

    def _release_late(self, claims: Sequence[Claim | KeyRefused]) -> None:
        for claim in claims:
            if isinstance(claim, Claim) and claim.outcome is Outcome.CLAIMED:
                key = claim.record.key
                self._abandon(asyncio.ensure_future(self._quietly_release(key, claim.fence)), None)

    async def _quietly_release(self, key: str, fence: int) -> None:
        with contextlib.suppress(StoreError):  # else the lease runs out by itself
            await self._bounded(self.inner.release(key, fence))

    async def claim(self, key: str, fingerprint: str) -> Claim:
        return await self._bounded(
            self.inner.claim(key, fingerprint), lambda claim: self._release_late([claim])
        )

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        return await self._bounded(self.inner.claim_many(requests), self._release_late)

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        return await self._bounded(self.inner.complete(key, fence, result))

    async def complete_encoded(self, completion: Completion) -> bool:
        return await self._bounded(self.inner.complete_encoded(completion))

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        return await self._bounded(self.inner.complete_many(completions))

    async def release(self, key: str, fence: int) -> bool:
        return await self._bounded(self.inner.release(key, fence))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._bounded(self.inner.fail(key, fence, error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._bounded(self.inner.heartbeat(key, fence))

    async def get(self, key: str) -> Record | None:
        return await self._bounded(self.inner.get(key))

    async def ping(self) -> None:
        await self._bounded(self.inner.ping())

    async def settle(self) -> None:
        """Wait for the calls still out: each gets one more deadline, then is cancelled and
        waited for (one more deadline at most). A claim that lands meanwhile is released,
        so no key is left held by nobody once the store closes."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        # Looped: a late claim that lands meanwhile adds its release to the set.
        while self._abandoned and (left := end - loop.time()) > 0:
            await asyncio.wait(set(self._abandoned), timeout=left)
        if self._abandoned:
            for task in self._abandoned:
                task.cancel()
            await asyncio.wait(set(self._abandoned), timeout=self.deadline)

    async def close(self) -> None:
        """Settle the calls still out, then close the store: a call left running past
        the close would open a connection nobody closes."""
        await self.settle()
        await self.inner.close()
