"""Reading the end state of a chaos run: the store's records and the broker's queues.

After the producer is done the run waits until every key is completed in the
store or dead-lettered, and the work, retry and conflict queues are empty.
The dead letters are read from the stream ``Q.dead-letters`` as they arrive,
by one consumer from its first record, and counted by letter id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Iterable

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from semel.consumer.broker.dead_letters import DlqEntry, entry_of
from semel.consumer.letters.log import STREAM_OFFSET, Event, content_id
from semel.consumer.names import H_DLQ_EVENT, H_LETTER_ID, Topology
from semel.settings import Settings
from semel.stores.base import Record, Status, Store
from semel.stores.errors import StoreError
from tests.consumer.harness import Broker

STORE_CALL_LIMIT = 3.0  # seconds the orchestrator waits for one store read
READ_CONCURRENCY = 16
STREAM_PREFETCH = 1000  # records the stream's consumer holds unacknowledged at most
ACK_EVERY = 100  # a stream's acks only grant credit; well under the prefetch
SYNC_LIMIT = 60.0  # seconds a reading waits for its own mark to come back


async def _bounded(store_call: Awaitable[Record | None]) -> Record | None:
    return await asyncio.wait_for(store_call, STORE_CALL_LIMIT)


async def statuses(store: Store, keys: Iterable[str]) -> dict[str, Status | None]:
    """Each key's status in the store; a key whose read fails counts as unknown (None)."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(key: str) -> tuple[str, Status | None]:
        async with limit:
            try:
                record = await _bounded(store.get(key))
            except (StoreError, TimeoutError):
                return key, None
            return key, None if record is None else record.status

    return dict(await asyncio.gather(*(one(k) for k in keys)))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


class LetterStream:
    """The dead letters' stream, consumed from its first record on as letters arrive.

    Read only: acks grant the consumer credit and remove nothing. Never a nack,
    a reject or a basic.get, which a stream answers by closing the connection.
    A letter is kept once per letter id, however many copies of it are read.
    """

    def __init__(self, connection: AbstractConnection, queue: str) -> None:
        self.connection = connection
        self.names = Topology(queue)
        self.letters: dict[str, DlqEntry] = {}
        self._channel: AbstractChannel | None = None
        self._next: int | None = None  # offset to resume from after a lost channel
        self._unacked = 0
        self._marks: dict[str, asyncio.Event] = {}

    async def _consuming(self) -> None:
        """Consume from the first record, or from where a lost channel left off."""
        if self._channel is not None and not self._channel.is_closed:
            return
        self._channel = await self.connection.channel()
        await self._channel.set_qos(prefetch_count=STREAM_PREFETCH)
        stream = await self._channel.declare_queue(self.names.dead_letter_log, passive=True)
        self._unacked = 0
        start: int | str = "first" if self._next is None else self._next
        await stream.consume(self._on_record, arguments={STREAM_OFFSET: start})

    async def _on_record(self, message: AbstractIncomingMessage) -> None:
        headers = dict(message.headers or {})
        offset = headers.pop(STREAM_OFFSET, None)
        event = headers.get(H_DLQ_EVENT)
        if isinstance(offset, int) and self._next is not None and offset < self._next:
            pass  # read before a lost channel (a resumed consumer may start a chunk early)
        elif event is None:
            letter_id = _text(headers.get(H_LETTER_ID)) or content_id(
                message.body, headers, message.message_id
            )
            if letter_id not in self.letters:
                self.letters[letter_id] = entry_of(
                    headers, message.routing_key, message.message_id, letter_id
                )
        elif _text(event) == Event.MARK:  # no command runs in a chaos run: no other event
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                seen = self._marks.get(json.loads(message.body).get("mark"))
                if seen is not None:
                    seen.set()
        if isinstance(offset, int):
            self._next = max(offset + 1, self._next or 0)
        self._unacked += 1
        if self._unacked >= ACK_EVERY or event is not None:
            await message.ack(multiple=True)
            self._unacked = 0

    async def sync(self) -> None:
        """Return once every record written before this call was read: append a
        mark (as ``semel dlq`` readers do, so they skip it) and wait for it."""
        await self._consuming()
        mark = uuid.uuid4().hex
        seen = self._marks[mark] = asyncio.Event()
        channel = await self.connection.channel(publisher_confirms=True)
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(
                    json.dumps({"mark": mark}).encode(),
                    headers={H_DLQ_EVENT: Event.MARK.value},
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=self.names.dead_letter_log,
            )
            await asyncio.wait_for(seen.wait(), SYNC_LIMIT)
        finally:
            del self._marks[mark]
            await channel.close()


class Drain:
    """Waits until every key is settled, reading the dead letters and the store as it goes."""

    def __init__(self, observer: Broker, store: Store, settings: Settings, keys: list[str]) -> None:
        self.observer, self.store, self.settings = observer, store, settings
        self.keys = keys
        self.stream = LetterStream(observer.connection, settings.queue)
        self.dead: dict[str, set[str]] = defaultdict(set)
        self.completed: set[str] = set()

    @property
    def dlq_messages(self) -> int:
        """Dead letters read, one per letter id."""
        return len(self.stream.letters)

    async def read_dlq(self) -> None:
        await self.stream.sync()
        for entry in self.stream.letters.values():
            self.dead[entry.key or ""].add(entry.reason or "")

    async def busy(self) -> int:
        """Messages waiting in the work, retry and conflict queues (the stream is none)."""
        return sum((await self.observer.depths(self.settings)).values())

    async def until_settled(self, deadline: float) -> bool:
        end = time.monotonic() + deadline
        pending = set(self.keys)
        while True:
            await self.read_dlq()
            pending -= self.dead.keys()
            found = await statuses(self.store, pending)
            pending -= {k for k, status in found.items() if status is Status.COMPLETED}
            if not pending and await self.busy() == 0:
                return True
            if time.monotonic() > end:
                return False
            await asyncio.sleep(0.5)

    async def final(self) -> None:
        await self.read_dlq()
        found = await statuses(self.store, self.keys)
        self.completed = {k for k, status in found.items() if status is Status.COMPLETED}
