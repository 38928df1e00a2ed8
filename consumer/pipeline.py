"""One delivery, start to end: parse -> key -> claim -> run -> record -> settle.

Each step is a small method; the store writes that follow a run are fenced by
the claim, and every decision is applied by :class:`consumer.settle.Settler`.
A store that cannot be reached never sends a message to the DLQ: the delivery
is handed back (``Requeue``) and the worker pauses until the store answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import structlog

from consumer.copies import Facts, first_seen
from consumer.decide import (
    Ack,
    DeadLetter,
    NackToConflict,
    Requeue,
    Retry,
    Run,
    Settle,
    attempt_of,
    decide_after_claim,
    decide_after_failure,
    decide_after_success,
    describe,
)
from consumer.handler import Context, Handler, Lease, LeaseLost, run_leased
from consumer.intake import Incoming
from consumer.message import BadMessage, KeySource, Parsed, best_effort_key, origin, parse
from consumer.names import Reason
from consumer.observe import Observer
from consumer.settle import AfterCopy, Settler
from settings import LogLevel, Settings, redact
from stores.base import Store
from stores.errors import ResultTooLarge, StoreUnavailable

T = TypeVar("T")
log = structlog.get_logger("semel.pipeline")

_WRITE_BACKOFF = (0.05, 1.0)  # first and longest pause between store-write retries
_RELEASE_WAIT = 5.0  # seconds a cut-short delivery waits to release its claim
SHUTDOWN = Requeue("shutdown", outcome="requeued-shutdown", store_down=False)


@dataclass(slots=True)
class Delivery:
    """One message on its way through the pipeline, and what is known of it so far."""

    message: Incoming
    facts: Facts
    headers: dict[str, Any]
    started: float
    fence: int | None = None


class Pipeline:
    """Processes deliveries of the work queue; safe to run concurrently."""

    def __init__(
        self,
        *,
        store: Store,
        handler: Handler,
        settings: Settings,
        settler: Settler,
        observer: Observer | None = None,
    ) -> None:
        self._store = store
        self._handler = handler
        self._settings = settings
        self._settler = settler
        self._source = KeySource.parse(settings.key_source)
        # An ACKed delivery's line is at debug: below that, its fields are not even built.
        self._log_acks = settings.log_level is LogLevel.DEBUG
        self._observer = observer or Observer()

    async def handle(self, message: Incoming) -> Settle:
        """Process and settle ``message``; returns the decision applied."""
        with self._observer.delivery(message):
            return await self._handle(message)

    async def _handle(self, message: Incoming) -> Settle:
        started = time.monotonic()
        headers = dict(message.headers)  # the one copy; the handler's context gets it too
        route = origin(
            headers, message.exchange or "", message.routing_key or "", self._settings.queue
        )
        attempt, seen = attempt_of(headers), first_seen(headers)
        try:
            parsed = parse(
                message.body,
                message.content_type,
                headers,
                message.message_id,
                source=self._source,
                limit=self._settings.max_body_bytes,
            )
        except BadMessage as bad:
            key = best_effort_key(headers, message.message_id, self._source)
            delivery = Delivery(message, Facts(key, attempt, route, seen), headers, started)
            return await self._settle(delivery, DeadLetter(bad.reason, str(bad)))
        facts = Facts(parsed.key, attempt, route, seen)
        delivery = Delivery(message, facts, headers, started)
        claimed_at = time.monotonic()
        try:
            claim = await self._store.claim(parsed.key, parsed.fingerprint)
        except StoreUnavailable as exc:
            return await self._settle(delivery, Requeue(describe(exc)))
        delivery.fence = claim.fence
        self._observer.claimed(claim, facts.attempt)
        step = decide_after_claim(claim)
        if not isinstance(step, Run):
            return await self._settle(delivery, step)
        lease = Lease(parsed.key, step.fence, self._settings.lock_ttl, renewed_at=claimed_at)
        return await self._run(delivery, parsed, lease)

    async def _run(self, delivery: Delivery, parsed: Parsed, lease: Lease) -> Settle:
        context = Context(
            key=parsed.key,
            body=parsed.body,
            headers=delivery.headers,
            routing_key=delivery.facts.origin.routing_key,
            message_id=delivery.message.message_id,
            attempt=delivery.facts.attempt,
            fence=lease.fence,
        )
        try:
            result = await run_leased(
                self._handler, context, self._store, lease, self._settings.handler_timeout
            )
        except asyncio.CancelledError:
            await self._cut_short(delivery, lease)
            raise
        except LeaseLost:
            # Release nothing: the key belongs to the worker that took it over.
            return await self._settle(delivery, NackToConflict("lease-lost"))
        except StoreUnavailable as exc:
            return await self._settle(delivery, Requeue(describe(exc)))
        except Exception as exc:  # the handler failed (or timed out): retry or dead-letter
            return await self._after_failure(delivery, lease, exc)
        return await self._after_success(delivery, lease, result)

    async def _after_success(self, delivery: Delivery, lease: Lease, result: Any) -> Settle:
        try:
            stored = await self._write(
                lease,
                lambda: self._store.complete(lease.key, lease.fence, result),
                past_lease=True,
            )
        except orjson.JSONEncodeError as exc:
            # Every store encodes the result before writing anything. Running
            # the handler again would return the same thing.
            return await self._dead_letter(
                delivery, lease, DeadLetter(Reason.PERMANENT_ERROR, f"result is not JSON: {exc}")
            )
        except ResultTooLarge as exc:
            return await self._dead_letter(
                delivery, lease, DeadLetter(Reason.PERMANENT_ERROR, describe(exc))
            )
        return await self._settle(delivery, decide_after_success(stored))

    async def _after_failure(self, delivery: Delivery, lease: Lease, exc: Exception) -> Settle:
        decision = decide_after_failure(exc, delivery.facts.attempt, self._settings)
        if isinstance(decision, DeadLetter):
            return await self._dead_letter(delivery, lease, decision)
        try:
            released = await self._write(lease, lambda: self._store.release(lease.key, lease.fence))
        except StoreUnavailable as store_exc:
            return await self._settle(delivery, Requeue(describe(store_exc)))
        # Not released: the claim was taken over meanwhile and the new owner decides.
        settle: Retry | NackToConflict = decision if released else NackToConflict("fenced-out")
        return await self._settle(delivery, settle, error=decision.error)

    async def _dead_letter(self, delivery: Delivery, lease: Lease, decision: DeadLetter) -> Settle:
        """Dead-letter a claimed key; it is marked failed once its copy is confirmed."""

        async def mark_failed() -> None:
            try:
                await self._write(
                    lease, lambda: self._store.fail(lease.key, lease.fence, decision.error)
                )
            except StoreUnavailable as exc:
                # The dead letter is safe in the DLQ already; the key stays
                # claimed until its lease runs out.
                log.warning("key not marked failed", key=lease.key, error=describe(exc))

        return await self._settle(delivery, decision, after_copy=mark_failed)

    async def _write(
        self, lease: Lease, write: Callable[[], Awaitable[T]], *, past_lease: bool = False
    ) -> T:
        """A fenced store write, retried while the lease still holds.

        With ``past_lease`` it is retried until the store answers: a completion
        is fenced, so written late it either lands (nobody took the key over)
        or is refused (somebody did). Giving up instead would hand the message
        back, and once the lease has expired its redelivery runs the handler again.
        """
        pause, longest = _WRITE_BACKOFF
        while True:
            try:
                return await write()
            except StoreUnavailable:
                if not past_lease and lease.remaining() <= pause:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)

    async def _cut_short(self, delivery: Delivery, lease: Lease) -> None:
        """Shutdown cut the handler short: free the key at once and hand the message back."""
        try:
            await asyncio.wait_for(self._store.release(lease.key, lease.fence), _RELEASE_WAIT)
        except (StoreUnavailable, TimeoutError) as exc:
            log.warning(
                "claim not released; it expires by itself", key=lease.key, error=describe(exc)
            )
        await self._settle(delivery, SHUTDOWN)

    async def _settle(
        self,
        delivery: Delivery,
        decision: Settle,
        *,
        after_copy: AfterCopy | None = None,
        error: str | None = None,
    ) -> Settle:
        """Apply ``decision`` and log the one line that says what became of the delivery."""
        facts = delivery.facts
        outcome = await self._settler.apply(
            delivery.message, decision, facts, after_copy=after_copy
        )
        self._observer.settled(delivery, decision, outcome)
        routine = isinstance(decision, Ack)
        if routine and not self._log_acks:
            return decision
        fields: dict[str, Any] = {
            "key": facts.key,
            "fence": delivery.fence,
            "attempt": facts.attempt,
            "outcome": outcome,
            "duration_ms": round((time.monotonic() - delivery.started) * 1000, 1),
        }
        if isinstance(decision, DeadLetter):
            fields["reason"] = decision.reason.value
        error = error or getattr(decision, "error", None)
        if error:
            fields["error"] = redact(error)  # exception text, bounded; never the body
        if routine:
            log.debug("settled", **fields)
        else:
            log.info("settled", **fields)
        return decision
