"""Every store call answers within a deadline, or counts as the store being down.

A connection whose packets are dropped on the way (a blackholed route, a
firewall that forgot the flow, a peer that froze) gives no error: the
client's bytes are acknowledged by nobody, or by a middlebox, and the call
waits for its client's own timeouts, which are often long or absent. A
worker cannot wait that long with a key claimed: its lease runs out, another
worker takes the key over, and nothing in this process notices.

:class:`DeadlineStore` bounds each call. Past the deadline the caller gets
:class:`StoreUnavailable` at once, so the delivery takes the outage path, and
the call itself is cancelled *in the background*: a client's own clean-up on
cancellation can take seconds (psycopg sends the server a cancel request and
waits for it), and the caller must not wait for that. A call given up on may
still land later; every write after a claim is fenced, so a late one changes
nothing that its owner did not mean to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from stores.base import JSON, Claim, ClaimRequest, Completion, DelegatingStore, Record, Store
from stores.errors import KeyRefused, StoreUnavailable

T = TypeVar("T")


class DeadlineStore(DelegatingStore):
    """``inner`` with every call bounded by ``deadline`` seconds (by default the
    store's :attr:`~stores.base.StoreConfig.call_deadline`)."""

    def __init__(self, inner: Store, deadline: float | None = None) -> None:
        super().__init__(inner)
        self.deadline = inner.config.call_deadline if deadline is None else deadline
        self._abandoned: set[asyncio.Task[Any]] = set()

    async def _bounded(self, call: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.deadline)
        except asyncio.CancelledError:
            self._abandon(task)
            raise
        if not done:
            self._abandon(task)
            raise StoreUnavailable(self.backend, f"no answer within {self.deadline:g}s")
        return task.result()

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        task.cancel()
        # Kept referenced until it ends, and its outcome retrieved: nobody awaits it.
        self._abandoned.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()

    async def claim(self, key: str, fingerprint: str) -> Claim:
        return await self._bounded(self.inner.claim(key, fingerprint))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        return await self._bounded(self.inner.claim_many(requests))

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

    async def close(self) -> None:
        if self._abandoned:  # already cancelled; their clean-up gets one more deadline
            await asyncio.wait(set(self._abandoned), timeout=self.deadline)
        await self.inner.close()
