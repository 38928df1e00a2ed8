"""Claims and completions of concurrent deliveries, sent to the store in batches.

With ``SEMEL_PREFETCH`` deliveries in flight, one store round trip per claim
and one per completion is what limits a worker: the client's per-call
machinery and the network wait dominate, not the store's work. A
:class:`Batcher` collects the calls made during one turn of the event loop
and hands them to the store as one ``claim_many`` / ``complete_many``; while
a batch is out, the next one fills up, so batches grow with the load and a
lone message still goes out at once (one loop turn later).

Each key is still decided atomically by the store, on its own; a batch only
shares the trip. Two calls for the same key never share a batch: the second
waits for the next one, so it sees the first one's outcome exactly as it
would have one call at a time.

A batch of completions that fails while the store still answers a ping (a
statement past a server limit, a timeout on one huge result) is split in
halves and each half sent again, down to the one completion that fails: one
bad key never holds the others. A claim granted to a caller that was
cancelled meanwhile (a worker stopping) is released at once, fenced, rather
than held for nobody until its lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import structlog

from semel.consumer.delivery.decide import describe
from semel.stores.base import JSON, Claim, ClaimRequest, Completion, DelegatingStore, Outcome, Store
from semel.stores.errors import KeyRefused, StoreMisconfigured

log = structlog.get_logger("semel.batching")

Request = TypeVar("Request", ClaimRequest, Completion)
Answer = TypeVar("Answer")

MAX_BATCH = 256  # one prefetch window: a batch never waits for more than is in flight
BATCHES_IN_FLIGHT = 1  # while one is out the next fills: fewer, larger trips
_RELEASE_WAIT = 5.0  # seconds a closing store waits for the releases of orphaned claims


class Batcher(Generic[Request, Answer]):
    """Groups the requests of one loop turn into one call of ``send``."""

    def __init__(
        self,
        send: Callable[[Sequence[Request]], Awaitable[Sequence[Answer | KeyRefused]]],
        *,
        max_batch: int = MAX_BATCH,
        in_flight: int = BATCHES_IN_FLIGHT,
        split: Callable[[Exception], Awaitable[bool]] | None = None,
        orphaned: Callable[[Request, Answer], None] | None = None,
    ) -> None:
        self._send: Callable[[Sequence[Request]], Awaitable[Sequence[Answer | KeyRefused]]] = send
        # Asked whether a failed batch of several should be sent again in halves.
        self._split: Callable[[Exception], Awaitable[bool]] | None = split
        # Told of an answer whose caller was gone before it came.
        self._orphaned: Callable[[Request, Answer], None] | None = orphaned
        self._max_batch = max_batch
        self._max_in_flight = in_flight
        self._pending: list[tuple[Request, asyncio.Future[Answer]]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._scheduled = False

    async def submit(self, request: Request) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        if self._scheduled or len(self._in_flight) >= self._max_in_flight or not self._pending:
            return
        # call_soon runs after every task already woken in this turn has had
        # its chance to submit: that is what fills a batch.
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch: list[tuple[Request, asyncio.Future[Answer]]] = []
        keys: set[str] = set()
        later = []
        for request, future in self._pending:
            if future.done():  # its caller was cancelled before it was sent
                continue
            if request.key in keys or len(batch) >= self._max_batch:
                later.append((request, future))
                continue
            keys.add(request.key)
            batch.append((request, future))
        self._pending = later
        if batch:
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._sent)
        self._schedule()

    async def _run(self, batch: list[tuple[Request, asyncio.Future[Answer]]]) -> None:
        try:
            await self._answer(batch)
        finally:
            # Whatever happened, no caller is left waiting for an answer that
            # will never come (cancelled: the loop is closing).
            for _, future in batch:
                future.cancel()  # a no-op on an answered future

    async def _answer(self, batch: list[tuple[Request, asyncio.Future[Answer]]]) -> None:
        try:
            answers = await self._send([request for request, _ in batch])
            if len(answers) != len(batch):  # misaligned: no answer can be trusted
                raise RuntimeError(f"{len(answers)} answers to a batch of {len(batch)}")
        except Exception as exc:
            if len(batch) > 1 and self._split is not None and await self._split(exc):
                half = len(batch) // 2
                await asyncio.gather(self._answer(batch[:half]), self._answer(batch[half:]))
                return
            for _, future in batch:  # every caller of the batch gets the failure
                if not future.done():
                    future.set_exception(exc)
            return
        for (request, future), answer in zip(batch, answers, strict=True):
            if future.done():  # its caller was cancelled while the batch was out
                if self._orphaned is not None and not isinstance(answer, KeyRefused):
                    self._orphaned(request, answer)
            elif isinstance(answer, KeyRefused):  # that key alone; the others stand
                future.set_exception(answer)
            else:
                future.set_result(answer)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._schedule()


def batched(store: Store) -> Store:
    """``store`` behind a :class:`BatchingStore` when it decides a batch in fewer
    trips than one call per key; as it is otherwise (nothing to gain by waiting)."""
    return (
        BatchingStore(store) if _claims_in_batches(store) or _completes_in_batches(store) else store
    )


def _backend(store: Store) -> Store:
    # Wrappers pass the batch calls on whatever the backend does with them.
    while isinstance(store, DelegatingStore):
        store = store.inner
    return store


def _claims_in_batches(store: Store) -> bool:
    return type(_backend(store)).claim_many is not Store.claim_many


def _completes_in_batches(store: Store) -> bool:
    return type(_backend(store)).complete_many is not Store.complete_many


class BatchingStore(DelegatingStore):
    """Wraps ``inner``: claims and completions go out in batches, the rest as is."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        # A store that batches only one of the two keeps single calls for the other.
        self._claims: Batcher[ClaimRequest, Claim] | None = (
            Batcher(inner.claim_many, orphaned=self._release_orphan)
            if _claims_in_batches(inner)
            else None
        )
        self._completions: Batcher[Completion, bool] | None = (
            Batcher(inner.complete_many, split=self._answers_alone)
            if _completes_in_batches(inner)
            else None
        )
        self._releases: set[asyncio.Task[None]] = set()

    async def _answers_alone(self, failure: Exception) -> bool:
        """Whether the store answers while a batch fails: then the batch is the trouble."""
        if isinstance(failure, StoreMisconfigured):
            return False  # every part would fail the same way
        try:
            await self.inner.ping()
        except Exception:
            return False  # away: the callers wait for it, the batch is not to blame
        return True

    def _release_orphan(self, request: ClaimRequest, claim: Claim) -> None:
        if claim.outcome is not Outcome.CLAIMED:
            return
        task = asyncio.get_running_loop().create_task(self._release(request.key, claim.fence))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, key: str, fence: int) -> None:
        try:
            await self.inner.release(key, fence)
        except Exception as exc:  # whatever it is, the lease still frees the key
            log.warning("orphaned claim not released", key=key, error=describe(exc))

    async def settle(self) -> None:
        """Wait for the releases of orphaned claims (cancelled after a while), so none
        is cut off by the store's close."""
        if self._releases:
            await asyncio.wait(set(self._releases), timeout=_RELEASE_WAIT)
        for task in list(self._releases):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        await self.settle()
        await super().close()

    async def claim(self, key: str, fingerprint: str) -> Claim:
        if self._claims is None:
            return await self.inner.claim(key, fingerprint)
        return await self._claims.submit(ClaimRequest(key, fingerprint))

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        if self._completions is None:
            return await self.inner.complete(key, fence, result)
        # Encoded before it joins a batch, so a refused result fails its own caller only.
        completion = Completion(key, fence, self.inner.encode_result(result))
        return await self._completions.submit(completion)

    async def complete_encoded(self, completion: Completion) -> bool:
        if self._completions is None:
            return await self.inner.complete_encoded(completion)
        return await self._completions.submit(completion)
