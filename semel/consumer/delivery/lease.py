"""Running a handler under its claim: a lease renewed by heartbeats, and lost on takeover.

A claim is a lease of ``SEMEL_LOCK_TTL`` seconds. From the claim until the
outcome is stored, a heartbeat renews it every third of that: while the
handler runs, and after, while its completion waits for a slow store (a
lease that lapsed there would let another copy run the handler again). If
the store answers that the claim was taken over while the handler runs, the
handler is cancelled at once and nothing more is written for it (the new
owner owns the key). If the store cannot be reached, the heartbeat keeps
trying until the lease would have run out, then gives up.

A plain handler's thread cannot be cancelled. Its key stays this worker's,
renewed, for as long as the thread runs: past its time limit, and at a stop
(never released under it). Should its lease be lost or about to lapse
unrenewed, the process ends and the thread with it
(:mod:`semel.consumer.delivery.thread_watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from semel.consumer.delivery.handler import Context, Handler, is_async, result_of, start_in_thread
from semel.consumer.delivery.thread_watch import THREAD_LEASES, ThreadLeases
from semel.consumer.delivery.timers import shared_timers
from semel.consumer.errors import HandlerTimeout, LeaseLost
from semel.stores.base import Store
from semel.stores.errors import KeyRefused, StoreError, StoreUnavailable

HEARTBEATS_PER_LEASE = 3
_MIN_WAIT = 0.01  # seconds: the shortest wait for a renewal's answer, or before the next
_CANCEL_WAIT = 5.0  # seconds an async handler gets to honour a cancellation


@dataclass(slots=True)
class Lease:
    """This worker's hold on a key, as far as it knows (monotonic clock)."""

    key: str
    fence: int
    ttl: float
    renewed_at: float
    # A thread of this worker still runs the handler: the key must not be
    # released, or another worker could run it at the same time.
    busy: bool = False

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.ttl

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()


class Renewal:
    """Renews one lease from timers until :meth:`stop`; no task of its own
    unless a renewal is due, so a delivery settled within a third of the
    lease (nearly all of them) costs nothing here.

    While the handler runs (:meth:`guard`), a claim that turns out taken over,
    or a store unreachable until the lease would have run out, cancels the
    handler's task and :attr:`lost` says why. Renewal stops for good
    ``give_up`` seconds after the guard starts: a handler that ignores its
    cancellation past its time limit does not keep the key from everyone
    else; its writes are fenced. Once the handler has ended, a lost lease
    only stops the renewals: the outcome's own write is fenced and tells.
    While a plain handler's thread runs, renewal never gives up and a lost
    lease ends the process (``threads``).
    """

    def __init__(
        self,
        store: Store,
        lease: Lease,
        answered: Callable[[float], None] | None = None,
        threads: ThreadLeases = THREAD_LEASES,
    ) -> None:
        self._store = store
        self.lease = lease
        self.threads = threads
        self._answered = answered  # told how long each renewal took (backpressure)
        self._loop = asyncio.get_running_loop()
        self._interval = lease.ttl / HEARTBEATS_PER_LEASE
        self._owner: asyncio.Task[Any] | None = None
        self._give_up_at = math.inf
        self._stopped = False
        self._beat: asyncio.Task[None] | None = None
        # Shared with the other leases of the loop: most are stopped long before
        # it is due, and a loop timer of their own would be set and cancelled
        # for nothing. A renewal runs up to an eighth of the interval early.
        self._timers = shared_timers(self._loop)
        self._timer = self._timers.call_later(self._interval, self._due)
        self._stop_when_thread_ends = False
        self.lost: BaseException | None = None

    def guard(self, owner: asyncio.Task[Any], give_up: float) -> None:
        """The handler runs in ``owner``: cancel it if the lease is lost."""
        self._owner = owner
        self._give_up_at = self._loop.time() + give_up

    def unguard(self) -> None:
        """The handler has ended; keep renewing until the outcome is stored."""
        self._owner = None

    def hold(self) -> None:
        """Renew for as long as the handler runs, past the time limit: its thread
        cannot be stopped, and the key must stay this worker's until it ends."""
        self._give_up_at = math.inf

    def _due(self) -> None:
        if self._stopped:
            return
        if self._loop.time() < self._give_up_at:
            self._beat = self._loop.create_task(self._renew())
        else:  # given up for good: a lease left to run out is never picked up again
            self._stopped = True

    async def _renew(self) -> None:
        lease = self.lease
        try:
            sent_at = time.monotonic()
            # Bounded by the lease: a store that never answers (packets dropped,
            # no reset) must not keep the handler running past it.
            async with asyncio.timeout(max(lease.remaining(), _MIN_WAIT)):
                try:
                    renewed = await self._store.heartbeat(lease.key, lease.fence)
                finally:
                    if self._answered is not None:
                        self._answered(time.monotonic() - sent_at)
        except TimeoutError:
            if lease.remaining() <= 0:
                self._lose(StoreUnavailable(self._store.backend, "no heartbeat answer in time"))
                return
            delay = _MIN_WAIT
        except KeyRefused as exc:
            # Something else now sits at the key: this worker's claim is gone.
            self._lose(LeaseLost(str(exc)))
            return
        except StoreError as exc:  # unreachable or refusing: the lease may still hold
            # Keep trying while the lease still holds; past it another worker
            # may own the key, so this one must stop.
            if lease.remaining() <= 0:
                self._lose(exc)
                return
            delay = min(self._interval / 2, max(lease.remaining(), _MIN_WAIT))
        else:
            if not renewed:
                self._lose(LeaseLost(f"claim of fence {lease.fence} was taken over"))
                return
            lease.renewed_at = sent_at
            delay = self._interval
        if not self._stopped:
            self._timer = self._timers.call_later(delay, self._due)

    def _lose(self, why: BaseException) -> None:
        if self._stopped:
            return
        if self.lease.busy:  # a thread cannot be cancelled: the process ends instead
            self.threads.lost(self.lease, f"{type(why).__name__}: {why}")
        self._stopped = True  # nothing left to renew
        self.lost = why
        if self._owner is not None:
            self._owner.cancel()

    def thread_ended(self, _: object = None) -> None:
        """The handler's thread has ended: a stop asked for meanwhile happens now."""
        if self._stop_when_thread_ends:
            self.let_go()

    def let_go(self) -> None:
        """Stop renewing now, a renewal in flight left to land (see :meth:`stop`)."""
        self._stopped = True
        self._owner = None
        self._timer.cancel()

    async def stop(self) -> None:
        """Stop renewing; a renewal already sent lands before the outcome is written,
        so no late renewal can hold a key this worker released. Idempotent.

        While the handler's thread still runs, renewal goes on until it ends:
        the key is held, never released under it.
        """
        self._owner = None
        if self.lease.busy:
            self._stop_when_thread_ends = True
            return
        self.let_go()
        beat, self._beat = self._beat, None
        if beat is not None and not beat.done():
            await asyncio.wait({beat}, timeout=_CANCEL_WAIT)
            if not beat.done():
                beat.cancel()


async def run_leased(
    handler: Handler,
    context: Context,
    renewal: Renewal,
    time_limit: float,
    overrun: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    *,
    stop_wait: float = 0.0,
    owner: asyncio.Task[Any] | None = None,
    asynchronous: bool | None = None,
) -> Any:
    """The handler's result, or its exception, :class:`HandlerTimeout`,
    :class:`LeaseLost` or :class:`StoreUnavailable` (the lease could not be kept).

    The handler runs in the caller's task (no task per delivery for it or its
    heartbeat); an async handler that swallows its cancellation keeps the
    caller waiting, but its lease is no longer renewed past the time limit.
    A plain handler's thread cannot be cancelled: its key stays owned,
    renewed, until the thread ends (``overrun`` is entered past the time
    limit, for the metric); only then does the attempt count as failed. A
    stop (the caller's task cancelled) gives the thread ``stop_wait`` more
    seconds: ended by then, its outcome is returned as if no stop had come;
    else the cancellation goes on, the key still held while the thread runs.
    ``renewal`` goes on after this returns: the caller stops it once the
    outcome is stored. ``owner`` (the caller's task) and ``asynchronous`` (whether
    ``handler`` is a coroutine function) are found here unless the caller knows them.
    """
    owner = owner or asyncio.current_task()
    assert owner is not None
    renewal.guard(owner, give_up=time_limit + _CANCEL_WAIT)
    try:
        if not (is_async(handler) if asynchronous is None else asynchronous):
            return await _in_thread(handler, context, renewal, time_limit, overrun, stop_wait)
        limit = _Limit(owner, time_limit)
        try:
            return await handler(context)
        except asyncio.CancelledError:
            if limit.expired():  # cancelled by the limit alone: a timeout
                raise HandlerTimeout(f"handler ran longer than {time_limit:g}s") from None
            raise
        finally:
            limit.end()
    except asyncio.CancelledError:
        # Cancelled by the renewal alone (nobody else asked): say why instead.
        if renewal.lost is not None and owner.uncancel() == 0:
            raise renewal.lost from None
        raise
    finally:
        renewal.unguard()


class _Limit:
    """An async handler's time limit: its task cancelled once the limit has passed,
    as ``asyncio.timeout`` would, on a shared timer (:mod:`timers`: never early,
    at most a quarter of a second late) rather than a loop timer per delivery."""

    __slots__ = ("_cancelling", "_fired", "_owner", "_slot")

    def __init__(self, owner: asyncio.Task[Any], seconds: float) -> None:
        self._owner = owner
        self._cancelling = owner.cancelling()  # cancellations asked before, not ours
        self._fired = False
        self._slot = shared_timers(owner.get_loop()).call_no_sooner(seconds, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._owner.cancel()

    def expired(self) -> bool:
        """Whether the cancellation under way is the limit's alone; takes it back
        if so (one ``uncancel``), as ``asyncio.timeout`` does on its way out."""
        if not self._fired:
            return False
        self._fired = False  # taken back once only
        return self._owner.uncancel() <= self._cancelling

    def end(self) -> None:
        self._slot.cancel()
        if self._fired:  # fired as the handler returned: its cancellation taken back
            self._fired = False
            self._owner.uncancel()


async def _in_thread(
    handler: Handler,
    context: Context,
    renewal: Renewal,
    time_limit: float,
    overrun: Callable[[], AbstractContextManager[object]],
    stop_wait: float,
) -> Any:
    lease = renewal.lease
    renewal.hold()
    watched = renewal.threads.hold(lease, renewal.let_go)

    def ended() -> None:  # on the handler's thread, before the loop hears of it
        lease.busy = False
        watched()

    lease.busy = True
    running = start_in_thread(handler, context, ended)
    running.add_done_callback(renewal.thread_ended)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    in_time = False
    try:
        done, _ = await asyncio.wait({running}, timeout=time_limit)
        in_time = bool(done)
        if not done:
            with overrun():
                await asyncio.wait({running})
    except asyncio.CancelledError:
        # A stop. The thread cannot be stopped: it gets a little longer to end.
        await asyncio.wait({running}, timeout=stop_wait)
        task = asyncio.current_task()
        if not running.done() or task is None or task.cancelling() > 1:
            raise
        task.uncancel()  # ended after all: its outcome counts as if no stop had come
        in_time = loop.time() <= deadline
    if in_time:
        return await result_of(running)
    if not running.cancelled():
        running.exception()  # retrieved: the attempt failed on time, whatever it raised
    raise HandlerTimeout(f"handler ran longer than {time_limit:g}s")
