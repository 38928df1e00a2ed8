"""The outbox relay: publishes committed outbox rows, then marks them sent.

A relay runs in every process the operator chooses (``semel relay``,
``engine.relay()``, ``semel consume``); see :mod:`semel.consumer.outbox.runner`.
It wakes up whenever its source's ``commits`` event is set (a commit of its
own process, a ``NOTIFY`` from any other) and every ``poll`` seconds
otherwise (the sweep: rows whose notification was lost, rows a crashed relay
left locked, refused rows whose back-off ended). A pass takes a batch of
unsent rows under ``FOR UPDATE SKIP LOCKED``, publishes them through
:func:`semel.consumer.broker.publishing.publish_confirmed` (confirmed,
``mandatory``, persistent), and marks the confirmed ones sent in the same
transaction; relays of other processes skip the locked rows.

In ``oldest-first`` order a batch is published all at once. In ``per-key``
order the rows of one key are published one after another, each only once
the one before it was confirmed; the first that is refused or unanswered
ends its key's run for this pass (what follows it stays unsent, untouched).

Every message carries the row's ``message_id`` and, unless the row's headers
have one, an ``Idempotency-Key`` header with the same value. A relay that dies
between the broker's confirm and its commit sends those rows again: the copy
has the same id, so a consumer downstream (semel, for one) drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity

from semel.consumer.backoff import Backoff
from semel.consumer.broker.publishing import Published, publish_confirmed
from semel.consumer.names import DEFAULT_EXCHANGE, IDEMPOTENCY_HEADER
from semel.consumer.outbox.source import OutboxSource
from semel.consumer.stopping import within
from semel.stores.errors import StoreUnavailable
from semel.stores.postgres.outbox import Ordering, OutboxMessage

BATCH = 100  # rows per pass (and per transaction)
POLL_INTERVAL = 1.0  # seconds between passes when no commit wakes the relay
ERROR_BACKOFF = (0.5, 10.0)  # first and longest pause after a pass that failed
STOP_WAIT = 5.0  # seconds a stopping relay gets to finish its pass

log = structlog.get_logger("semel.outbox")


def outgoing(row: OutboxMessage) -> aio_pika.Message:
    """The AMQP message for ``row``, with a stable id (made persistent when published)."""
    message_id = str(row.message_id)
    headers: dict[str, Any] = dict(row.headers)
    if not any(name.lower() == IDEMPOTENCY_HEADER.lower() for name in headers):
        headers[IDEMPOTENCY_HEADER] = message_id
    return aio_pika.Message(
        row.body, headers=headers, content_type=row.content_type, message_id=message_id
    )


def refusal(outcome: Published | BaseException) -> str | None:
    """Why the broker refused a message for good, or ``None`` when it did not.

    ``outcome`` is the broker's answer to one publish, or what was raised
    instead. A refused row waits out a back-off; one caught in a broken
    channel or connection is simply tried again on the next pass.
    """
    if outcome is Published.RETURNED:
        return "unroutable: no queue is bound for its routing key"
    if outcome is Published.NACKED:
        return "refused by the broker (basic.nack)"
    if isinstance(outcome, ChannelNotFoundEntity):  # the broker closed the channel with a 404
        return f"exchange not found: {outcome}"
    return None


class Relay:
    """Moves committed outbox rows from ``source`` to the broker through ``channel``
    (publisher confirms on, returns raised)."""

    def __init__(
        self,
        source: OutboxSource,
        channel: AbstractChannel,
        *,
        batch: int = BATCH,
        poll: float = POLL_INTERVAL,
        ordering: Ordering = Ordering.OLDEST_FIRST,
    ) -> None:
        self._source = source
        self._channel = channel
        self._batch = batch
        self._poll = poll
        self._ordering = ordering
        self._exchanges: dict[str, AbstractExchange] = {}
        self._stopping = asyncio.Event()

    async def relay_once(self) -> int:
        """One pass: at most one batch; returns how many rows it took."""
        return await self._source.relay(self._batch, self._publish, self._ordering)

    async def run(self) -> None:
        """Pass after pass until :meth:`stop`; store and broker trouble only pause it."""
        backoff = Backoff(*ERROR_BACKOFF)
        while not self._stopping.is_set():
            self._source.commits.clear()
            try:
                taken = await self.relay_once()
            except Exception as exc:  # the relay must outlive any one failed pass
                pause = backoff.next()
                if isinstance(exc, StoreUnavailable | AMQPError | ConnectionError | TimeoutError):
                    log.warning("outbox relay pass failed", error=repr(exc), retry_in=pause)
                else:
                    log.exception("outbox relay pass failed unexpectedly", retry_in=pause)
                # Not Backoff.wait(): a stop must end the pause at once.
                await self._idle(pause, wake_on_commit=False)
                continue
            backoff.reset()
            if taken < self._batch:  # a full batch means more may be waiting
                await self._idle(self._poll, wake_on_commit=True)

    async def stop(self, task: asyncio.Task[None]) -> None:
        """End ``task`` (running :meth:`run`) once its pass is done, then send what is left.

        Each step is bounded (:func:`semel.consumer.stopping.within`),
        a pass cut short included: rows not sent by then wait for the next relay.
        """
        self._stopping.set()
        ended = True
        with contextlib.suppress(Exception):  # run() failing is also an end
            ended = await within(STOP_WAIT, "the outbox relay's pass", task)
        if not ended:
            return  # a pass cut short leaves its rows unsent, never lost
        with contextlib.suppress(Exception):
            await within(STOP_WAIT, "the outbox relay's last passes", self._last_passes())

    async def _last_passes(self) -> None:
        while await self.relay_once() >= self._batch:
            pass

    async def _idle(self, seconds: float, *, wake_on_commit: bool) -> None:
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if wake_on_commit:
            waits.append(asyncio.ensure_future(self._source.commits.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _publish(self, rows: list[OutboxMessage]) -> dict[int, str | None]:
        """Publish ``rows``; confirmed ones map to ``None``, refused ones to why.

        Rows that got no answer (a broken channel, a timeout) are left out: unsent,
        they are simply taken again by the next pass.
        """
        if self._ordering is Ordering.PER_KEY:
            runs: dict[str, list[OutboxMessage]] = {}
            for row in rows:
                runs.setdefault(row.key, []).append(row)
            answers: dict[int, str | None] = {}
            for found in await asyncio.gather(*(self._publish_run(run) for run in runs.values())):
                answers |= found
            return answers
        results = await asyncio.gather(
            *(self._publish_one(row) for row in rows), return_exceptions=True
        )
        return self._answers(rows, results)

    async def _publish_run(self, run: list[OutboxMessage]) -> dict[int, str | None]:
        """One key's rows in order, each after the one before it was confirmed."""
        answers: dict[int, str | None] = {}
        for row in run:
            if not row.due:
                break  # waits out its back-off; what follows waits for it
            try:
                result: Published | BaseException = await self._publish_one(row)
            except Exception as exc:
                result = exc
            answers |= self._answers([row], [result])
            if answers.get(row.id, "") is not None:
                break  # refused or unanswered: the key's later rows stay behind it
        return answers

    def _answers(
        self, rows: list[OutboxMessage], results: list[Published | BaseException]
    ) -> dict[int, str | None]:
        answers: dict[int, str | None] = {}
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if result is Published.CONFIRMED:
                answers[row.id] = None
                continue
            why = refusal(result)
            if why is not None:
                log.warning(
                    "outbox message refused, will retry",
                    message_id=str(row.message_id),
                    exchange=row.exchange,
                    routing_key=row.routing_key,
                    attempts=row.attempts + 1,
                    error=why,
                )
                answers[row.id] = why
        return answers

    async def _publish_one(self, row: OutboxMessage) -> Published:
        exchange = await self._exchange(row.exchange)
        return await publish_confirmed(exchange, outgoing(row), row.routing_key)

    async def _exchange(self, name: str) -> AbstractExchange:
        if name == DEFAULT_EXCHANGE:
            return self._channel.default_exchange
        if name not in self._exchanges:
            self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
        return self._exchanges[name]
