"""One delivery, start to end: parse -> key -> claim -> run -> record -> settle.

:meth:`Pipeline.handle` reads as that sequence; each step is a small method.
Every store write after a claim is fenced by it, and every decision is a value
(:mod:`semel.consumer.delivery.decide`) handed to a :class:`Settler`, the broker's
side, which never calls back. A store that cannot be reached never sends a
message to the DLQ: the delivery is handed back (``Requeue``) and the worker
pauses until the store answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from semel.consumer.delivery.completed_cache import CompletedCache
from semel.consumer.delivery.decide import (
    CACHED_DUPLICATE,
    SHUTDOWN,
    Ack,
    Applied,
    Copied,
    DeadLetter,
    Detour,
    NackToConflict,
    Outcome,
    Requeue,
    Retry,
    Run,
    Settle,
    decide_after_claim,
    decide_after_failure,
    decide_after_success,
    decide_bad_message,
    decide_by_record,
    decide_store_error,
    describe,
)
from semel.consumer.delivery.error_site import error_site
from semel.consumer.delivery.facts import Delivery, Facts
from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.keyed import (
    claim_key,
    record_failed,
    record_success,
    release,
    release_after_failure,
)
from semel.consumer.delivery.lease import Lease, Renewal, run_leased
from semel.consumer.delivery.log_lines import Summary, bound_to
from semel.consumer.delivery.message import Incoming, Parsed
from semel.consumer.delivery.observe import Observer
from semel.consumer.delivery.pressure import Pressure
from semel.consumer.delivery.reading import read
from semel.consumer.delivery.results import storable
from semel.consumer.delivery.routes import Routes
from semel.consumer.delivery.writes import write_fenced
from semel.consumer.errors import BadMessage, LeaseLost
from semel.consumer.names import DELIVERY_COUNT, RETURNS_BEFORE_DETOUR, returns
from semel.stores.base import Store
from semel.stores.errors import StoreError, StoreMisconfigured

log = structlog.get_logger("semel.pipeline")

# Seconds a stop gives a plain handler's thread, which cannot be cancelled, to
# end after the grace: one that ends in time is recorded as usual; the key of
# one still running stays held until it ends or the process exits.
THREAD_STOP_WAIT = 5.0
# A store answer slower than this share of the lease lets fewer deliveries at
# the store (see semel.consumer.delivery.pressure): half the third of the lease after
# which a claim is given up and a call abandoned, so the limit bites before
# leases are at risk.
PRESSURE_TARGET = 1 / 6


class Settler(Protocol):
    """The broker's side of settling, implemented by
    :class:`semel.consumer.broker.settle.Settler`."""

    async def copy(self, message: Incoming, decision: Copied, facts: Facts) -> bool:
        """Publish the retry copy or dead letter; ``True`` once the broker confirmed it."""

    async def finish(self, message: Incoming, decision: Settle) -> Applied:
        """Ack or nack ``message`` as ``decision`` says (a copied one: ack)."""

    async def give_back(self, message: Incoming) -> Applied:
        """Hand ``message`` back: its copy was not confirmed."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """The values one delivery is processed with, whichever handler it goes to (a
    handler's own key source, retries and time limit are its route's)."""

    queue: str
    lock_ttl: float
    in_flight: int = 256  # deliveries at the store at once while it answers quickly
    log_acks: bool = False  # an ACKed delivery's line is at debug: below that, not even built
    # Keys known completed, shared by a process's pipelines (one store); None:
    # every delivery asks the store. The front doors keep None: their duplicate
    # answers the stored result, which the cache does not hold.
    completed: CompletedCache | None = None


class Pipeline:
    """Processes deliveries of the work queue; safe to run concurrently."""

    def __init__(
        self,
        *,
        store: Store,
        routes: Routes,
        settler: Settler,
        config: PipelineConfig,
        observer: Observer | None = None,
    ) -> None:
        self._store = store
        self.routes = routes
        self._settler = settler
        self._config = config
        self._observer = observer or Observer()
        # Tasks of deliveries whose handler has ended: a stop lets them record
        # the outcome and settle (see :meth:`concluding`).
        self._concluding: set[asyncio.Task[Any]] = set()
        self._pressure = Pressure(
            config.in_flight, config.lock_ttl * PRESSURE_TARGET, self._observer.admitting
        )
        self.summary = Summary(queue=config.queue)

    @property
    def config(self) -> PipelineConfig:
        return self._config

    async def handle(self, message: Incoming) -> Settle:
        """Process and settle ``message``; returns the decision applied."""
        with self._observer.delivery(message):
            delivery, parsed = self.read(message)
            # The broker writes the count only on a message it had back: most
            # deliveries have none, and are spared the parsing.
            headers = delivery.headers
            if DELIVERY_COUNT in headers and returns(headers) >= RETURNS_BEFORE_DETOUR:
                # Further returns could bring it to the broker's delivery limit,
                # where the message would be dropped; nothing is claimed.
                return await self._settle(delivery, Detour())
            if isinstance(parsed, BadMessage):
                return await self._settle(delivery, decide_bad_message(parsed))
            completed = self._config.completed
            known = None if completed is None else completed.answer(parsed.key, parsed.fingerprint)
            if known is not None:
                # Completed, with this very body: what the store would answer. No
                # claim, so no admission either: nothing goes to the store.
                delivery.fence = known.fence
                return await self._settle(delivery, CACHED_DUPLICATE)
            admitted_at = await self._pressure.admit()
            try:
                return await self._claimed(delivery, parsed)
            finally:
                self._pressure.leave(admitted_at)

    def concluding(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task``'s handler has ended and its outcome is being recorded and
        settled. A stop must not cut such a delivery short: the key would be held
        for nobody until its lease ran out, and then the work it did would run
        again (seen with plain handlers ending just as a rolling restart began)."""
        return task in self._concluding

    async def _claimed(self, delivery: Delivery, parsed: Parsed) -> Settle:
        step = await self._claim(delivery, parsed)
        if not isinstance(step, Lease):
            return await self._settle(delivery, step)
        # Renewed from here until the outcome is stored, not only while the
        # handler runs: a completion queued behind a slow store keeps its key.
        renewal = Renewal(self._store, step, self._pressure.answered)
        task = asyncio.current_task()  # looked up once: the handler runs in it too
        try:
            decision = await self._run(delivery, parsed, renewal, task)
            return await self._settle(delivery, decision, lease=step)
        except Exception:
            # A bug in semel, not the handler's failure: free the key now
            # rather than when its lease runs out, and let the worker park
            # the message. The release is fenced: a key settled meanwhile
            # is left as it is.
            await release(self._store, step, renewal)
            raise
        finally:
            if task is not None:
                self._concluding.discard(task)
            await renewal.stop()

    def read(self, message: Incoming) -> tuple[Delivery, Parsed | BadMessage]:
        """The delivery's facts, and its body and key or why it cannot be processed."""
        return read(message, self.routes, self._config.queue)

    async def _claim(self, delivery: Delivery, parsed: Parsed) -> Settle | Lease:
        """Claim the key: a lease to run under, or what to do instead."""
        ttl = self._config.lock_ttl
        try:
            claimed = await claim_key(
                self._store, parsed.key, parsed.fingerprint, ttl, self._pressure.answered
            )
        except StoreError as exc:
            return decide_store_error(exc)
        delivery.fence = claimed.claim.fence
        if self._config.completed is not None:
            self._config.completed.learn(parsed.key, claimed.claim)
        self._observer.claimed(claimed.claim, delivery.facts.attempt)
        step = decide_after_claim(claimed.claim)
        if not isinstance(step, Run):
            return step
        if claimed.lease is None:  # granted too late to run under: released already
            return Requeue(f"claim answered after {claimed.waited:.2f}s of a {ttl:g}s lease")
        return claimed.lease

    async def _run(
        self,
        delivery: Delivery,
        parsed: Parsed,
        renewal: Renewal,
        task: asyncio.Task[Any] | None,
    ) -> Settle:
        """Run the handler under ``renewal``'s lease, then record what it did; the
        decision to settle."""
        lease = renewal.lease
        route = delivery.route
        assert route is not None  # only a delivery with a route is claimed
        context = Context(
            key=route.message_key(parsed.key),
            body=parsed.body,
            headers=delivery.headers,
            routing_key=delivery.facts.origin.routing_key,
            message_id=delivery.message.message_id,
            attempt=delivery.facts.attempt,
            fence=lease.fence,
            validated=parsed.validated,
        )
        try:
            with bound_to(context):
                result = await run_leased(
                    route.handler,
                    context,
                    renewal,
                    route.handler_timeout,
                    self._observer.overrun,
                    stop_wait=THREAD_STOP_WAIT,
                    owner=task,
                    asynchronous=route.asynchronous,
                )
        except asyncio.CancelledError:
            await self._cut_short(delivery, renewal)
            raise
        except Exception as exc:
            self._conclude(task)
            return await self._record_failure(delivery, renewal, exc)
        self._conclude(task)
        return await self._record_success(lease, parsed.fingerprint, result)

    def _conclude(self, task: asyncio.Task[Any] | None) -> None:
        """The handler has ended: from here a stop lets the delivery finish."""
        if task is not None:
            self._concluding.add(task)

    async def _record_success(self, lease: Lease, fingerprint: str, result: Any) -> Settle:
        stored_form = storable(self._store, lease.key, result)
        sent_at = time.monotonic()
        try:
            stored = await record_success(self._store, lease, stored_form)
        except StoreError as exc:  # refused for good, or a store not set up for semel
            return decide_store_error(exc)
        self._pressure.answered(time.monotonic() - sent_at)
        if stored and self._config.completed is not None:
            self._config.completed.completed(lease.key, fingerprint, lease.fence, sent_at)
        return decide_after_success(stored)

    async def _record_failure(self, delivery: Delivery, renewal: Renewal, exc: Exception) -> Settle:
        if isinstance(exc, LeaseLost):
            # Release nothing: the key belongs to the worker that took it over.
            return NackToConflict(Outcome.LEASE_LOST)
        if isinstance(exc, StoreError):  # the lease could not be kept
            return decide_store_error(exc)
        # The handler failed (or timed out): retry or dead-letter.
        route = delivery.route
        assert route is not None
        site = error_site(exc, route.handler)
        decision = decide_after_failure(exc, delivery.facts.attempt, route.retry, site)
        if isinstance(decision, DeadLetter):
            # Ownership is checked before the dead letter, and the key marked
            # failed once it is confirmed; renewed until then.
            return decision
        try:
            released = await release_after_failure(self._store, renewal)
        except StoreError as store_exc:
            return decide_store_error(store_exc)
        if released.done:
            return decision
        fence = renewal.lease.fence
        return decide_by_record(released.record, fence, decision.error) or NackToConflict(
            Outcome.FENCED_OUT, error=decision.error
        )

    async def _settle(
        self, delivery: Delivery, decision: Settle, *, lease: Lease | None = None
    ) -> Settle:
        """Apply ``decision``: the copy first, if any, then the ack or nack.

        A dead letter of a key this worker claimed goes out only if the claim
        still holds (read back: work that committed is never dead-lettered),
        and the key is marked failed between the broker's confirm and the ACK,
        so a key is never failed without its dead letter nor ACKed in progress.
        """
        message = delivery.message
        if lease is not None and isinstance(decision, DeadLetter):
            decision = await self._owned(lease, decision) or decision
        if isinstance(decision, Retry | DeadLetter | Detour):
            if not await self._settler.copy(message, decision, delivery.facts):
                return self._report(delivery, decision, await self._settler.give_back(message))
            if lease is not None and isinstance(decision, DeadLetter):
                decision = await self._mark_failed(lease, decision)
        return self._report(delivery, decision, await self._settler.finish(message, decision))

    async def _owned(self, lease: Lease, decision: DeadLetter) -> Settle | None:
        """``None`` while the claim holds; else what to do instead of the dead letter."""
        try:
            record = await write_fenced(lease, lambda: self._store.get(lease.key), past_lease=True)
        except StoreError as exc:  # the key cannot be read: the dead letter goes out
            log.warning("claim not read before its dead letter", key=lease.key, error=describe(exc))
            return None
        return decide_by_record(record, lease.fence, decision.error)

    async def _mark_failed(self, lease: Lease, decision: DeadLetter) -> Settle:
        """Mark the key failed after its dead letter was confirmed; what to settle with.

        Retried until the store answers, with the key held meanwhile: ACKed
        while still in progress, the key would run the dead-lettered handler
        again for a late copy once its lease lapsed.
        """
        try:
            marked = await record_failed(self._store, lease, decision.error)
        except StoreMisconfigured as exc:
            # Handed back and consumption stops: never ACKed with the key in progress.
            return decide_store_error(exc)
        except StoreError as exc:  # this key cannot be held: no copy of it can run either
            log.warning("key not marked failed", key=lease.key, error=describe(exc))
            return decision
        if not marked:
            # Taken over while the store was away: the new owner runs it.
            log.warning("dead letter sent, but its claim was taken over", key=lease.key)
            return replace(decision, outcome=Outcome.FENCED_OUT)
        return decision

    async def _cut_short(self, delivery: Delivery, renewal: Renewal) -> None:
        """Shutdown cut the handler short: free the key at once (unless its thread
        still runs) and hand the message back."""
        await release(self._store, renewal.lease, renewal)
        await self._settle(delivery, SHUTDOWN)

    def _report(self, delivery: Delivery, decision: Settle, applied: Applied) -> Settle:
        """Tell the observer and the summary, and log the one line that says what
        became of the delivery."""
        self._observer.settled(delivery, decision, applied)
        self.summary.add(applied.logged)
        routine = isinstance(decision, Ack)
        if routine and not self._config.log_acks:
            return decision
        facts = delivery.facts
        fields: dict[str, Any] = {
            "key": facts.key,
            "fence": delivery.fence,
            "attempt": facts.attempt,
            "outcome": applied.logged,
            "duration_ms": round((time.monotonic() - delivery.started) * 1000, 1),
        }
        if isinstance(decision, DeadLetter):
            fields["reason"] = decision.reason.value
        elif isinstance(decision, Ack) and decision.cached:
            fields["cached"] = True  # answered by the worker's cache: the store was not asked
        error = None if isinstance(decision, Ack) else decision.error
        if error:
            fields["error"] = error  # exception text, never the body
        (log.debug if routine else log.info)("settled", **fields)
        return decision
