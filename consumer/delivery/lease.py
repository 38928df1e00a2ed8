"""Running a handler under its claim: a lease renewed by heartbeats, and lost on takeover.

A claim is a lease of ``SEMEL_LOCK_TTL`` seconds. While the handler runs, a
heartbeat renews it every third of that; if the store answers that the claim
was taken over, the handler is cancelled at once and nothing more is written
for it (the new owner owns the key). If the store cannot be reached, the
heartbeat keeps trying until the lease would have run out, then gives up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from consumer.delivery.handler import Context, Handler, invoke
from consumer.errors import HandlerTimeout, LeaseLost
from stores.base import Store
from stores.errors import StoreUnavailable

HEARTBEATS_PER_LEASE = 3
_CANCEL_WAIT = 5.0  # seconds an async handler gets to honour a cancellation


@dataclass(slots=True)
class Lease:
    """This worker's hold on a key, as far as it knows (monotonic clock)."""

    key: str
    fence: int
    ttl: float
    renewed_at: float

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.ttl

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()


class _Renewal:
    """Renews one lease from timers while its handler runs; no task of its own
    unless a renewal is due, so a handler that finishes within a third of the
    lease (nearly all of them) costs nothing here.

    When the claim turns out taken over, or the store stays unreachable until
    the lease would have run out, the handler's task is cancelled and
    :attr:`lost` says why. Renewal stops for good ``give_up`` seconds after
    the start: a handler that ignores its cancellation past its time limit
    does not keep the key from everyone else; its writes are fenced.
    """

    def __init__(self, store: Store, lease: Lease, owner: asyncio.Task[Any], give_up: float):
        self._store = store
        self._lease = lease
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self._interval = lease.ttl / HEARTBEATS_PER_LEASE
        self._give_up_at = self._loop.time() + give_up
        self._stopped = False
        self._beat: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(self._interval, self._due)
        self.lost: BaseException | None = None

    def _due(self) -> None:
        if not self._stopped and self._loop.time() < self._give_up_at:
            self._beat = self._loop.create_task(self._renew())

    async def _renew(self) -> None:
        lease = self._lease
        try:
            sent_at = time.monotonic()
            renewed = await self._store.heartbeat(lease.key, lease.fence)
        except StoreUnavailable as exc:
            # Keep trying while the lease still holds; past it another worker
            # may own the key, so this one must stop.
            if lease.remaining() <= 0:
                self._lose(exc)
                return
            delay = min(self._interval / 2, max(lease.remaining(), 0.01))
        else:
            if not renewed:
                self._lose(LeaseLost(f"claim of fence {lease.fence} was taken over"))
                return
            lease.renewed_at = sent_at
            delay = self._interval
        if not self._stopped:
            self._timer = self._loop.call_later(delay, self._due)

    def _lose(self, why: BaseException) -> None:
        if not self._stopped:
            self.lost = why
            self._owner.cancel()

    async def stop(self) -> None:
        """Stop renewing; a renewal already sent lands before the outcome is written,
        so no late renewal can hold a key this worker released."""
        self._stopped = True
        self._timer.cancel()
        if self._beat is not None and not self._beat.done():
            await asyncio.wait({self._beat}, timeout=_CANCEL_WAIT)
            if not self._beat.done():
                self._beat.cancel()


async def run_leased(
    handler: Handler, context: Context, store: Store, lease: Lease, time_limit: float
) -> Any:
    """The handler's result, or its exception, :class:`HandlerTimeout`,
    :class:`LeaseLost` or :class:`StoreUnavailable` (the lease could not be kept).

    The handler runs in the caller's task (no task per delivery for it or its
    heartbeat); an async handler that swallows its cancellation keeps the
    caller waiting, but its lease is no longer renewed past the time limit.
    """
    owner = asyncio.current_task()
    assert owner is not None
    renewal = _Renewal(store, lease, owner, give_up=time_limit + _CANCEL_WAIT)
    try:
        async with asyncio.timeout(time_limit) as limit:
            return await invoke(handler, context)
    except asyncio.CancelledError:
        # Cancelled by the renewal alone (nobody else asked): say why instead.
        if renewal.lost is not None and owner.uncancel() == 0:
            raise renewal.lost from None
        raise
    except TimeoutError:
        if limit.expired():
            raise HandlerTimeout(f"handler ran longer than {time_limit:g}s") from None
        raise
    finally:
        await renewal.stop()
