"""The chaos run's producer: distinct orders, concurrent copies and late copies.

:func:`plan` decides, from a seed, what is sent: each distinct key once, a
share of the keys again as copies published back to back with the original
(they race it through the consumers), and a share again as late copies,
published only once the store says the key is done. :class:`Publisher` sends
with publisher confirms and ``mandatory``; a publish that is not confirmed
(the broker restarts under it) is sent again until it is, so the producer is
at-least-once like a real one, and every resend is one more duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

ROUTING_KEY = "order.paid"
KEY_HEADER = "Idempotency-Key"
SEND_DEADLINE = 120.0  # seconds one message may take to be confirmed, outages included
LATE_AFTER = (1.0, 4.0)  # seconds after its original that a late copy is first tried
LATE_RECHECK = 0.5  # seconds before a late copy asks the store again
LATE_TRIES = 60  # then it goes out anyway, counted as not yet complete
GATE_LEAD = 0.05  # share of the originals the producer may run ahead of a fault's gate
# Share of the keys whose handler fails: once, on every attempt, or permanently.
FAILURES = (("transient", 0.03), ("always", 0.005), ("permanent", 0.015))


@dataclass(frozen=True, slots=True)
class Order:
    """One distinct key and what is sent for it."""

    key: str
    body: dict[str, Any]
    copies: int  # concurrent copies besides the original
    late: int  # late copies, sent once the key is done

    @property
    def encoded(self) -> bytes:
        return orjson.dumps(self.body)


def order_body(n: int, rng: random.Random) -> dict[str, Any]:
    # Mostly short handlers, a tail of slow ones: a few ms to a few hundred ms.
    work = rng.randint(5, 60) if rng.random() < 0.7 else rng.randint(60, 300)
    body: dict[str, Any] = {
        "order": n,
        "work_ms": work,
        "effect_at": round(rng.uniform(0.2, 0.8), 2),
    }
    roll = rng.random()
    for kind, share in FAILURES:
        if roll < share:
            body["fail"] = kind
            break
        roll -= share
    return body


def plan(messages: int, duplicates: float, run: str, rng: random.Random) -> list[Order]:
    """``messages`` in all, a ``duplicates`` share of them copies: half concurrent, half late."""
    if not 0 <= duplicates < 1 or messages < 2:
        raise ValueError("need at least 2 messages and a duplicate share in [0, 1)")
    distinct = max(1, round(messages * (1 - duplicates)))
    extra = messages - distinct
    concurrent = extra // 2
    copies = [0] * distinct
    late = [0] * distinct
    for index in rng.choices(range(distinct), k=concurrent):
        copies[index] += 1
    for index in rng.choices(range(distinct), k=extra - concurrent):
        late[index] += 1
    return [Order(f"{run}-{n}", order_body(n, rng), copies[n], late[n]) for n in range(distinct)]


@dataclass(slots=True)
class Sent:
    """What the broker confirmed, by kind."""

    originals: int = 0
    concurrent_copies: int = 0
    late_copies: int = 0
    late_before_done: int = 0  # late copies whose key was still not done after LATE_TRIES
    resends: int = 0  # publishes not confirmed, sent again (the broker may hold both)

    @property
    def total(self) -> int:
        return self.originals + self.concurrent_copies + self.late_copies + self.late_before_done


class Publisher:
    """Confirmed publishes to one exchange that outlast a broker restart."""

    def __init__(self, url: str, exchange: str) -> None:
        self.url = url
        self.exchange_name = exchange
        self.sent = Sent()
        self._connection: AbstractConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> AbstractExchange:
        async with self._lock:
            if self._exchange is None or self._connection is None or self._connection.is_closed:
                await self.close()
                self._connection = await aio_pika.connect(self.url, timeout=5)
                channel: AbstractChannel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
                self._exchange = await channel.get_exchange(self.exchange_name, ensure=False)
            return self._exchange

    async def send(self, order: Order) -> None:
        """Publish one copy of ``order``; return once the broker confirmed one."""
        end = time.monotonic() + SEND_DEADLINE
        while True:
            try:
                exchange = await self._open()
                message = aio_pika.Message(
                    order.encoded,
                    headers={KEY_HEADER: order.key},
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await exchange.publish(message, ROUTING_KEY, mandatory=True, timeout=10)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # Broker away or the confirm lost: drop the connection, send again.
                if time.monotonic() > end:
                    raise
                self.sent.resends += 1
                self._exchange = None
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


Done = Callable[[str], Awaitable[bool]]


@dataclass(slots=True)
class Gate:
    """A point of the originals' flow that holds the producer until a fault has run.

    A fault that waits for handlers in flight falls behind the clock when
    restarts are slow (a loaded machine): timed by the wall clock alone, the
    last ones came after the originals had run out and found only late
    copies, which run no handler. Held near the gate, the producer keeps a few
    messages coming for the fault to find running.
    """

    share: float  # of the originals sent before the gate
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    passed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(order=True)
class _Late:
    due: float
    tries: int = field(compare=False)
    order: Order = field(compare=False)


async def _hold_at(gates: list[Gate], index: int, originals: int) -> float:
    """Reach the gates at or before ``index``; wait for those GATE_LEAD behind it
    to be passed. Returns the seconds held."""
    for gate in gates:
        if gate.share * originals <= index:
            gate.reached.set()
    # Never more than GATE_LEAD of the originals past a fault not yet run: it
    # finds them running, and the flow does not end before it does.
    behind = [
        gate.passed.wait()
        for gate in gates
        if (gate.share + GATE_LEAD) * originals <= index and not gate.passed.is_set()
    ]
    if not behind:
        return 0.0
    held = time.monotonic()
    await asyncio.gather(*behind)
    return time.monotonic() - held


async def produce(
    publisher: Publisher,
    orders: list[Order],
    rate: float,
    is_done: Done,
    rng: random.Random,
    gates: list[Gate] | None = None,
) -> Sent:
    """Send every order with its copies at ``rate`` messages/s; late copies as keys finish.

    Each of ``gates`` is reached at its share of the originals, and holds them
    GATE_LEAD further on until it has been passed."""
    late: list[_Late] = []
    originals_done = asyncio.Event()

    async def originals() -> None:
        started = time.monotonic()
        sent = 0
        for index, order in enumerate(orders):
            # The rate resumes after a hold, with no burst to catch up.
            started += await _hold_at(gates or [], index, len(orders))
            await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
            # The original and its copies go out together: they race each other.
            await asyncio.gather(*(publisher.send(order) for _ in range(1 + order.copies)))
            publisher.sent.originals += 1
            publisher.sent.concurrent_copies += order.copies
            sent += 1 + order.copies
            for _ in range(order.late):
                heapq.heappush(late, _Late(time.monotonic() + rng.uniform(*LATE_AFTER), 0, order))
        originals_done.set()

    async def late_copies() -> None:
        while late or not originals_done.is_set():
            if not late or late[0].due > time.monotonic():
                await asyncio.sleep(0.05)
                continue
            item = heapq.heappop(late)
            if await is_done(item.order.key):
                await publisher.send(item.order)
                publisher.sent.late_copies += 1
            elif item.tries >= LATE_TRIES:
                await publisher.send(item.order)
                publisher.sent.late_before_done += 1
            else:
                due = time.monotonic() + LATE_RECHECK
                heapq.heappush(late, _Late(due, item.tries + 1, item.order))

    await asyncio.gather(originals(), late_copies())
    return publisher.sent
