"""The moving parts of one turn of the DLQ: the consumer's inbox, the copies in
flight, the acks. What a turn guarantees, and why, is :mod:`semel.consumer.broker.turn`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from dataclasses import dataclass

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, DeliveryError, PublishError
from pamqp.commands import Basic

from semel.consumer import names
from semel.consumer.broker.dead_letters import letter_id
from semel.consumer.broker.publishing import BROKER_TROUBLE, Published
from semel.consumer.broker.turn_actions import (
    Decide,
    Drop,
    Keep,
    Letter,
    Pace,
    Properties,
    TurnReport,
    kept_headers,
    tail_properties,
)
from semel.consumer.names import CONFIRM_TIMEOUT, H_TURN

IDLE = 2.0  # seconds without a delivery before asking whether the queue has any left


@dataclass(frozen=True, slots=True)
class _Out:
    """A copy as it goes to the broker."""

    body: bytes
    properties: Properties
    exchange: str
    routing_key: str


class Flow:
    """One turn's moving parts: the consumer's inbox, the copies in flight, the acks."""

    def __init__(
        self,
        connection: AbstractConnection,
        channel: aio_pika.abc.AbstractChannel,
        queue: str,
        decide: Decide,
        window: int,
        report: TurnReport,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.queue = queue
        self.decide = decide
        self.window = window
        self.report = report
        self.depth = report.depth
        self.turn_id = uuid.uuid4().hex
        self.inbox: deque[DeliveredMessage] = deque()
        self.wake: asyncio.Future[None] | None = None  # set while waiting for a delivery
        self.failure: BaseException | None = None
        self.seen: set[str] = set()
        self.tags: list[int] = []  # delivery tag of each letter, by index
        self.settled = bytearray(self.depth)
        self.prefix = 0  # letters before it all settled
        self.acked = 0  # letters before it all acked
        self.ack_lock = asyncio.Lock()
        self.batch = max(1, window // 8)
        self.copying: set[asyncio.Task[None]] = set()
        self.unsettled = 0  # copies not yet confirmed (their tasks may still be running)
        self.sending: dict[str, asyncio.Task[None]] = {}  # sends in flight, by message id
        self.exchanges: dict[str, bool] = {"": True}
        self.last_send: asyncio.Task[None] | None = None

    def ackable(self) -> int:
        """How many letters may be acked before the consumer is cancelled.

        The broker delivers while fewer than ``window`` letters are unacked, so
        it can have delivered at most acks + window. Holding back the acks of
        the last ``window`` letters keeps that at the depth: the turn never
        receives one of its own copies, or a letter that arrived after it began.
        """
        return min(self.prefix, self.depth - self.window)

    async def run(self, pace: Pace) -> None:
        await self.channel.set_qos(prefetch_count=self.window)
        under = await self.channel.get_underlay_channel()
        assert isinstance(under, aiormq.Channel)  # its basic_publish can skip the drain
        self.under = under
        consuming = await self.under.basic_consume(self.queue, self._deliver, no_ack=False)
        tag = consuming.consumer_tag
        assert tag is not None  # the broker names every consumer
        self.tag = tag
        try:
            await self._take(tag, pace)
        except Exception:
            await self._wind_down(tag)
            raise
        finally:
            for task in self.copying:
                task.cancel()

    async def _take(self, tag: str, pace: Pace) -> None:
        for index in range(self.depth):
            delivered = await self._next()
            if delivered is None:
                self.report.short = self.depth - index
                break
            message = aio_pika.IncomingMessage(delivered, no_ack=False)
            if (message.headers or {}).get(H_TURN) == self.turn_id:
                self.report.short = self.depth - index
                self.inbox.appendleft(delivered)
                break
            self.tags.append(_tag(delivered))
            letter = Letter(message, letter_id(message), index)
            await self._one(letter, delivered.header.properties, pace)
        await self.under.basic_cancel(tag)
        while self.inbox:  # past the letters of the turn: to the tail as they are
            delivered = self.inbox.popleft()
            self.report.beyond += 1
            message = aio_pika.IncomingMessage(delivered, no_ack=False)
            extra = Letter(message, letter_id(message), len(self.tags))
            self.tags.append(_tag(delivered))
            self.settled.append(0)
            source = delivered.header.properties
            await self._start(extra, source, self._tail(extra, source, Keep()), sending=False)
        await self._copied()
        await self._ack(len(self.tags))

    async def _wind_down(self, tag: str) -> None:
        """After an error: no more deliveries, the copies in flight confirmed or given up,
        every settled letter acked. Closing the channel then hands back the rest."""
        with contextlib.suppress(*BROKER_TROUBLE):
            await self.under.basic_cancel(tag)  # a second cancel is a no-op
            if self.copying:
                await asyncio.wait(set(self.copying), timeout=CONFIRM_TIMEOUT)
            for task in self.copying:
                task.cancel()
            await self._ack(self.prefix)
            for index in range(self.prefix, len(self.tags)):
                if self.settled[index]:
                    await self.under.basic_ack(self.tags[index])

    async def _deliver(self, delivered: DeliveredMessage) -> None:
        self.inbox.append(delivered)
        self._wake()

    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def _next(self) -> DeliveredMessage | None:
        """The next delivery; ``None`` once the queue has no more (it held fewer than the
        depth said); the error of a copy that failed, since no more may come."""
        while not self.inbox:
            self._raise_failure()
            if not self.unsettled:  # no copy left to settle and send the acks due
                await self._ack()
            self.wake = asyncio.get_running_loop().create_future()
            try:
                done, _ = await asyncio.wait({self.wake}, timeout=IDLE)
            finally:
                self.wake = None
            if not done and await self._exhausted():
                return None
        self._raise_failure()
        return self.inbox.popleft()

    async def _exhausted(self) -> bool:
        """Whether the queue has nothing left to deliver, no copy being confirmed."""
        if self.tag not in self.under.consumers:  # the broker cancelled it: none will come
            raise RuntimeError(f"the broker cancelled the consumer of {self.queue}")
        if self.copying:
            return False
        probe = await self.connection.channel()
        try:
            declared = await probe.declare_queue(self.queue, passive=True)
        finally:
            with contextlib.suppress(AMQPError, ConnectionError, RuntimeError):
                await probe.close()
        return not declared.declaration_result.message_count and not self.inbox

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def _one(self, letter: Letter, source: Properties, pace: Pace) -> None:
        if letter.letter_id in self.seen:
            self.report.doubles += 1
            await self._settle(letter.index)
            return
        self.seen.add(letter.letter_id)
        action = await self.decide(letter)
        if isinstance(action, Drop):
            self.report.dropped += 1
            await self._settle(letter.index)
        elif isinstance(action, Keep):
            await self._start(letter, source, self._tail(letter, source, action), sending=False)
        else:
            if pace.limited and self.last_send is not None and not self.last_send.done():
                # The broker takes a channel's publishes in order: a send queued behind
                # unconfirmed copies would arrive late, bunched with the next ones,
                # above the rate. Each paced send waits for the one before it.
                await asyncio.wait({self.last_send})
            await pace.wait()
            if await self._exchange_exists(action.exchange):
                message = action.message
                message.delivery_mode = aio_pika.DeliveryMode.PERSISTENT
                out = _Out(message.body, message.properties, action.exchange, action.routing_key)
                await self._start(letter, source, out, sending=True)
            else:
                self.report.refused += 1
                await self._start(letter, source, self._tail(letter, source, Keep()), sending=False)

    def _tail(self, letter: Letter, source: Properties, keep: Keep) -> _Out:
        """A copy of ``letter`` for the tail, marked as this turn's."""
        headers = kept_headers(letter, keep)
        headers[H_TURN] = self.turn_id
        properties = tail_properties(source, headers, keep.expiration)
        return _Out(letter.message.body, properties, names.DEFAULT_EXCHANGE, self.queue)

    async def _exchange_exists(self, name: str) -> bool:
        """Asked once per exchange, on a channel of its own: publishing to a missing
        exchange would close the turn's channel, handing back every letter in flight."""
        if name not in self.exchanges:
            probe = await self.connection.channel()
            try:
                await probe.get_exchange(name, ensure=True)
                self.exchanges[name] = True
            except ChannelNotFoundEntity:
                self.exchanges[name] = False
            finally:
                with contextlib.suppress(AMQPError, ConnectionError, RuntimeError):
                    await probe.close()
        return self.exchanges[name]

    async def _start(self, letter: Letter, source: Properties, out: _Out, *, sending: bool) -> None:
        """Publish a copy now, in the letters' order; its confirm is awaited by a task."""
        message_id = out.properties.message_id
        if message_id is not None and message_id in self.sending:
            # aiormq matches a returned message to the latest publish of its message
            # id: a send (which may come back) must have its answer before another
            # copy with that id goes.
            await asyncio.wait({self.sending[message_id]})
        # Tasks start in the order they are made, each straight onto the channel's
        # publish lock: the copies go out in the letters' order.
        task = asyncio.create_task(self._copy(letter, source, out, sending))
        self.copying.add(task)
        self.unsettled += 1
        if sending:
            self.last_send = task
        if sending and message_id is not None:
            self.sending[message_id] = task
        task.add_done_callback(lambda done: self._copy_done(done, message_id))

    def _copy_done(self, task: asyncio.Task[None], message_id: str | None) -> None:
        self.copying.discard(task)
        if message_id is not None and self.sending.get(message_id) is task:
            del self.sending[message_id]
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()
            self._wake()

    async def _copy(self, letter: Letter, source: Properties, out: _Out, sending: bool) -> None:
        if sending:
            answer = await self._publish(out)
            if answer is Published.CONFIRMED:
                self.report.sent += 1
                self.unsettled -= 1
                await self._settle(letter.index)
                return
            self.report.refused += 1
            out = self._tail(letter, source, Keep())
        answer = await self._publish(out)
        if answer is not Published.CONFIRMED:
            raise RuntimeError(f"the broker answered {answer} to a copy for {self.queue}")
        self.report.kept += 1
        self.unsettled -= 1
        await self._settle(letter.index)

    async def _publish(self, out: _Out) -> Published:
        """:func:`~semel.consumer.broker.publishing.publish_confirmed` (persistent, mandatory,
        confirmed, bounded in time) straight on aiormq's channel: without an
        ``aio_pika.Message``, a task for the timeout, or a wait for the socket."""
        try:
            answer = await self.under.basic_publish(
                out.body,
                exchange=out.exchange,
                routing_key=out.routing_key,
                properties=out.properties,
                mandatory=True,
                timeout=CONFIRM_TIMEOUT,
                wait=False,
            )
        except PublishError:
            return Published.RETURNED
        except DeliveryError:
            return Published.NACKED
        return Published.CONFIRMED if isinstance(answer, Basic.Ack) else Published.RETURNED

    async def _settle(self, index: int) -> None:
        self.settled[index] = 1
        while self.prefix < len(self.tags) and self.settled[self.prefix]:
            self.prefix += 1
        # Acks go in batches, one frame for many letters; while the turn waits for
        # a delivery, the last copy to settle sends what is due.
        last = self.wake is not None and not self.unsettled
        if last or self.ackable() - self.acked >= self.batch:
            await self._ack(least=1 if last else self.batch)

    async def _ack(self, count: int | None = None, *, least: int = 1) -> None:
        """Ack the first ``count`` letters (all settled; ``None``: all that may be), with
        one ``multiple`` ack, if that is at least ``least`` more than were acked."""
        async with self.ack_lock:  # one at a time, so their tags rise
            count = self.ackable() if count is None else count
            if count - self.acked >= least:
                self.acked = count
                await self.under.basic_ack(self.tags[count - 1], multiple=True, wait=False)

    async def _copied(self) -> None:
        """Every copy confirmed (or the first error raised)."""
        while self.copying:
            await asyncio.wait(set(self.copying))
        self._raise_failure()


def _tag(delivered: DeliveredMessage) -> int:
    tag = delivered.delivery_tag
    assert tag is not None  # a delivery to a consumer always has one
    return tag
