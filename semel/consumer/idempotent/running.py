"""One idempotent call: claim the key, then run the function under the lease, or
answer from what the key holds. The claim, the lease and every write after
it are the worker's own steps (:mod:`semel.consumer.delivery.keyed`,
:mod:`semel.consumer.delivery.lease`); this module only decides what a call
returns or raises.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
import structlog

from semel.consumer.delivery.decide import describe
from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.keyed import (
    claim_key,
    record_failed,
    record_success,
    release,
    release_after_failure,
)
from semel.consumer.delivery.lease import Lease, Renewal, run_leased
from semel.consumer.errors import LeaseLost, PermanentError
from semel.consumer.idempotent.arguments import Arguments, Bound
from semel.consumer.idempotent.cache import Completed, CompletedKeys
from semel.consumer.idempotent.calls import CURRENT_CALL, Call, Duplicate
from semel.consumer.idempotent.errors import (
    KeyFailed,
    KeyInProgress,
    PayloadMismatch,
    ResultNotStored,
    RetryLater,
)
from semel.consumer.idempotent.returns import Returns
from semel.stores.base import POISON_ERROR, Claim, Outcome, Record, Store
from semel.stores.errors import StoreError, StoreUnavailable

log = structlog.get_logger("semel.idempotent")

InProgress = Literal["raise", "wait", "retry_later"]
StoreFor = Callable[[float | None], Awaitable[Store]]
OnDuplicate = Callable[[Any, Duplicate], Any]

# A waiting call asks again after this, doubling up to _LAST_PAUSE: quick for
# a short run, a few claims a second at most for a long one.
_FIRST_PAUSE = 0.02
_LAST_PAUSE = 0.5
# The default time limit in leases: 10, as the worker's defaults (a 30 s lease,
# a 300 s handler timeout). The lease is renewed meanwhile: the limit only
# bounds a function that hangs.
TIME_LIMIT_LEASES = 10


@dataclass(frozen=True, slots=True)
class Options:
    """The decorator's options, checked (see :func:`semel.consumer.idempotent.idempotent`)."""

    store_for: StoreFor
    scope: str
    expires_after: float | None
    on_duplicate: OnDuplicate | None
    in_progress: InProgress
    wait_timeout: float
    time_limit: float | None


class Runner:
    """Runs the calls of one decorated function."""

    def __init__(
        self,
        function: Callable[..., Awaitable[Any]],
        options: Options,
        arguments: Arguments,
        cache: CompletedKeys,
    ) -> None:
        self._function = function
        self._options = options
        self._arguments = arguments
        self._returns = Returns(function)
        self._cache = cache

    async def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = self._arguments.bind(args, kwargs)
        stored_key = f"{self._options.scope}:{bound.key}" if self._options.scope else bound.key
        hit = self._cache.get(stored_key)
        if hit is not None:
            if hit.fingerprint != bound.fingerprint:
                raise PayloadMismatch(bound.key)
            return await self._duplicate(bound, hit, cached=True)
        store = await self._options.store_for(self._options.expires_after)
        deadline = time.monotonic() + self._options.wait_timeout
        pause = _FIRST_PAUSE
        while True:
            # Raises StoreUnavailable when the store cannot be reached: the
            # function never runs without its claim.
            claimed = await claim_key(store, stored_key, bound.fingerprint, store.config.lock_ttl)
            if claimed.lease is not None:
                attempt = claimed.claim.record.claims
                return await self._run(store, claimed.lease, attempt, bound, stored_key)
            if claimed.late:
                raise StoreUnavailable(
                    store.backend, f"claim answered after {claimed.waited:.2f}s of its lease"
                )
            if claimed.claim.outcome is not Outcome.IN_PROGRESS:
                return await self._answer(store, bound, stored_key, claimed.claim)
            # The holder may end, or die and let its lease lapse: then a
            # waiting call's next claim runs the function itself.
            await asyncio.sleep(self._wait(bound, claimed.claim.record, deadline, pause))
            pause = min(pause * 2, _LAST_PAUSE)

    def _wait(self, bound: Bound, record: Record, deadline: float, pause: float) -> float:
        """Seconds to wait before claiming again, or the in-progress policy's error."""
        left = _lease_left(record)
        if self._options.in_progress == "retry_later":
            raise RetryLater(bound.key, left)
        wait = min(pause, max(left, _FIRST_PAUSE), deadline - time.monotonic())
        if self._options.in_progress == "raise" or wait <= 0:
            raise KeyInProgress(bound.key, left)
        return wait

    async def _answer(self, store: Store, bound: Bound, stored_key: str, claim: Claim) -> Any:
        """What a claim that was not granted answers: the result, or an error."""
        record = claim.record
        if claim.outcome is Outcome.DUPLICATE:
            entry = self._completed(store, bound, record.result, record, record.expires_at)
            self._cache.put(stored_key, entry)
            return await self._duplicate(bound, entry, cached=False)
        if claim.outcome is Outcome.MISMATCH:
            raise PayloadMismatch(bound.key)
        # POISON or FAILED: failed for good, never run again.
        raise KeyFailed(bound.key, record.error or POISON_ERROR)

    async def _duplicate(self, bound: Bound, entry: Completed, *, cached: bool) -> Any:
        result = self._returns.rebuild(entry.result)
        hook = self._options.on_duplicate
        if hook is None:
            return result
        scope, fence = self._options.scope, entry.fence
        info = Duplicate(bound.key, scope, fence, entry.completed_at, entry.expires_at, cached)
        answer = hook(result, info)
        return await answer if inspect.isawaitable(answer) else answer

    def _completed(
        self,
        store: Store,
        bound: Bound,
        result: Any,
        by: Record | Lease,
        expires_at: datetime | None,
    ) -> Completed:
        """A cache entry of the run ``by`` completed, kept no longer than the store keeps it."""
        now = datetime.now(UTC)
        retention = self._options.expires_after or store.config.retention
        if expires_at is None or (expires_at - now).total_seconds() > retention:
            expires_at = now + timedelta(seconds=retention)
        until = time.monotonic() + (expires_at - now).total_seconds()
        completed_at = by.updated_at if isinstance(by, Record) else now
        return Completed(bound.fingerprint, result, by.fence, completed_at, expires_at, until)

    async def _run(
        self, store: Store, lease: Lease, attempt: int, bound: Bound, stored_key: str
    ) -> Any:
        """Run the function under ``lease``, renewed until its outcome is stored."""
        args, kwargs = self._arguments.call_with(bound.values, lease.fence)
        function = self._function

        async def invoke(_: Context) -> Any:  # run_leased hands its context to the callable
            return await function(*args, **kwargs)

        context = Context(stored_key, {}, {}, "", None, attempt, lease.fence)
        limit = self._options.time_limit or store.config.lock_ttl * TIME_LIMIT_LEASES
        renewal = Renewal(store, lease)
        token = CURRENT_CALL.set(Call(bound.key, self._options.scope, lease.fence, attempt))
        try:
            try:
                result = await run_leased(invoke, context, renewal, limit)
            finally:
                CURRENT_CALL.reset(token)
        except asyncio.CancelledError:
            await release(store, lease, renewal)  # the caller gave up: free the key now
            raise
        except Exception as exc:
            await _failed(store, renewal, exc)
            raise
        except BaseException:  # KeyboardInterrupt, SystemExit: left to its lease, unrenewed
            renewal.let_go()
            raise
        return await self._record(store, renewal, bound, stored_key, result)

    async def _record(
        self, store: Store, renewal: Renewal, bound: Bound, stored_key: str, result: Any
    ) -> Any:
        """Store ``result`` under the claim; the caller's answer."""
        lease = renewal.lease
        try:
            data = self._returns.encode(store, bound.key, result)
        except ResultNotStored:
            await release(store, lease, renewal)
            raise
        try:
            stored = await record_success(store, lease, orjson.Fragment(data))
        finally:
            await renewal.stop()
        if not stored:
            # Taken over before the result was written: the new owner's run decides the key.
            raise LeaseLost(f"claim of fence {lease.fence} was taken over before its result")
        self._cache.put(stored_key, self._completed(store, bound, orjson.loads(data), lease, None))
        return result


async def _failed(store: Store, renewal: Renewal, exc: Exception) -> None:
    """The function raised ``exc`` (or timed out): settle the key, fenced."""
    if renewal.lost is not None:
        # Taken over (the key is the new owner's), or the lease could not be
        # kept (it has lapsed): nothing to write.
        await renewal.stop()
        return
    lease = renewal.lease
    try:
        if isinstance(exc, PermanentError):
            try:
                await record_failed(store, lease, describe(exc))
            finally:
                await renewal.stop()
        else:
            await release_after_failure(store, renewal)
    except StoreError as store_exc:  # the caller hears of its own failure, not of this
        log.warning("key not settled after a failure", key=lease.key, error=describe(store_exc))


def _lease_left(record: Record) -> float:
    """Seconds the holder's lease runs by the store's record; 0 when unknown or over."""
    if record.lease_expires_at is None:
        return 0.0
    return max((record.lease_expires_at - datetime.now(UTC)).total_seconds(), 0.0)
