"""The steps of one run under a key's claim that know nothing of a broker.

Claim the key into a :class:`Lease`, record a success or a terminal failure
fenced, release after a failure, give a claim up. The worker's
:class:`semel.consumer.delivery.pipeline.Pipeline` and the
:mod:`semel.consumer.idempotent` decorator both run a key through these, so
the rules of a claim (a late answer is not run under, a completion outlives
the lease, a refused release is read back) hold the same for either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from semel.consumer.delivery.decide import describe
from semel.consumer.delivery.lease import HEARTBEATS_PER_LEASE, Lease, Renewal
from semel.consumer.delivery.writes import write_fenced
from semel.stores.base import Claim, Outcome, Record, Store
from semel.stores.errors import StoreError

log = structlog.get_logger("semel.pipeline")

RELEASE_WAIT = 5.0  # seconds a claim given up waits for the store to release it


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a claim decided, and the lease to run under when it was granted in time."""

    claim: Claim
    lease: Lease | None = None
    waited: float = 0.0  # seconds a late grant took, its release included

    @property
    def late(self) -> bool:
        """Granted, but answered too late to be run under: released already."""
        return self.claim.outcome is Outcome.CLAIMED and self.lease is None


@dataclass(frozen=True, slots=True)
class Released:
    """The answer to a release after a failure: ``record`` read back when refused."""

    done: bool
    record: Record | None = None


async def claim_key(
    store: Store,
    key: str,
    fingerprint: str,
    ttl: float,
    answered: Callable[[float], None] | None = None,
) -> Claimed:
    """Claim ``key``; raises what the store raises. ``answered`` is told how long it took."""
    claimed_at = time.monotonic()
    try:
        claim = await store.claim(key, fingerprint)
    finally:
        if answered is not None:
            answered(time.monotonic() - claimed_at)
    if claim.outcome is not Outcome.CLAIMED:
        return Claimed(claim)
    lease = Lease(key, claim.fence, ttl, renewed_at=claimed_at)
    if lease.remaining() < lease.ttl * (1 - 1 / HEARTBEATS_PER_LEASE):
        # The answer took longer than the first heartbeat may: a store this
        # slow cannot be trusted to keep the lease alive, and the work could
        # outlive it. Free the key and wait for the store instead.
        await release(store, lease)
        return Claimed(claim, waited=time.monotonic() - claimed_at)
    return Claimed(claim, lease)


async def record_success(store: Store, lease: Lease, stored_form: object) -> bool:
    """Complete the key with ``stored_form``; ``False`` if the claim was taken over.

    Retried until the store answers, even past a bug in semel: the work
    succeeded, and giving the key up would run it again.
    """
    return await write_fenced(
        lease, lambda: store.complete(lease.key, lease.fence, stored_form), past_lease=True
    )


async def record_failed(store: Store, lease: Lease, error: str) -> bool:
    """Mark the key failed for good; ``False`` if the claim was taken over.

    Retried until the store answers: a key left in progress would run the
    failed work again once its lease lapsed.
    """
    return await write_fenced(
        lease, lambda: store.fail(lease.key, lease.fence, error), past_lease=True
    )


async def release_after_failure(store: Store, renewal: Renewal) -> Released:
    """Release the key after the work failed, so the next claim runs it again.

    Not released means taken over meanwhile (the new owner decides), or
    completed by this very claim (a COMMIT whose answer came too late): the
    record is read back to tell which. Raises :class:`StoreError` once the
    lease has run out unanswered.
    """
    lease = renewal.lease
    await renewal.stop()  # a renewal landing after the release would hold the key
    if await write_fenced(lease, lambda: store.release(lease.key, lease.fence)):
        return Released(done=True)
    record = await write_fenced(lease, lambda: store.get(lease.key))
    return Released(done=False, record=record)


async def release(store: Store, lease: Lease, renewal: Renewal | None = None) -> None:
    """Free the key at once, if the store answers soon; else its lease runs out.

    Never while a thread of this process still runs the work: the key stays
    held, renewed, until the thread ends or the process (and the thread with
    it) exits, then is left to its lease; nobody else ever runs it at the
    same time.
    """
    if renewal is not None:
        await renewal.stop()  # a renewal landing after the release would hold the key
    if lease.busy:
        log.warning(
            "handler thread still running; its key stays held until it ends or the "
            "process exits, then its lease runs out",
            key=lease.key,
        )
        return
    try:
        await asyncio.wait_for(store.release(lease.key, lease.fence), RELEASE_WAIT)
    except (StoreError, TimeoutError) as exc:
        log.warning("claim not released; it expires by itself", key=lease.key, error=describe(exc))
