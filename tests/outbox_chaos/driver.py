"""The load driver: concurrent ``POST /orders``, some rolled back on purpose, some repeated.

:func:`plan` decides from a seed what each order is: meant to commit, or
sent with ``"fail": true`` (the endpoint rolls it back after staging), and
whether the client sends it again once answered, as a client that timed out
would. :func:`drive` sends them at a steady rate. A request whose answer is
lost (the web process SIGKILLed, a connection refused while it restarts, a
timeout, a 5xx other than the rolled-back one while PostgreSQL is away) is
sent again with the same key and body, to another web process, until an
answer comes: so every order meant to commit ends committed, and an order
sent with ``fail`` is only ever sent with it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

# Requests in flight at most: a web client's own pool. Beyond it requests wait here,
# not in httpcore, whose pool scans every waiting request on each change: with
# thousands queued while PostgreSQL is away it spends the event loop on that.
CONCURRENCY = 64
REQUEST_TIMEOUT = 5.0  # seconds before the client gives up on an answer and sends again
ORDER_DEADLINE = 120.0  # seconds one order may take to be answered, faults included
BACK_OFF = (0.05, 1.0)  # first and longest pause between two tries of one order
ROLLED_BACK = "failed after staging: rolled back"  # the example's on-purpose 500


@dataclass(frozen=True, slots=True)
class Order:
    key: str
    body: dict[str, Any]
    repeat: bool  # sent again once answered, with the same key

    @property
    def fail(self) -> bool:
        return bool(self.body.get("fail"))


@dataclass(slots=True)
class Answer:
    status: int
    message_id: str | None


@dataclass(slots=True)
class Driven:
    """What the client saw."""

    answers: dict[str, list[Answer]] = field(default_factory=dict)
    requests: int = 0
    lost_answers: Counter[str] = field(default_factory=Counter)  # why, e.g. "ReadError"
    unanswered: list[str] = field(default_factory=list)  # orders past ORDER_DEADLINE
    wall: float = 0.0

    @property
    def retries(self) -> int:
        return sum(self.lost_answers.values())


def plan(count: int, fail: float, repeat: float, run: str, rng: random.Random) -> list[Order]:
    orders = []
    for n in range(count):
        body: dict[str, Any] = {"item": f"item-{rng.randint(1, 50)}"}
        body["amount"] = rng.randint(100, 9999)
        if rng.random() < fail:
            body["fail"] = True
        orders.append(Order(f"{run}-order-{n}", body, rng.random() < repeat))
    return orders


class Client:
    """One HTTP client over the web processes' ports, trying another on each failure."""

    def __init__(self, ports: list[int], rng: random.Random, driven: Driven) -> None:
        self.ports, self.rng, self.driven = ports, rng, driven
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
        self.http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits)
        self.slots = asyncio.Semaphore(CONCURRENCY)

    async def until_answered(self, order: Order) -> Answer | None:
        """Send ``order`` until a web process answers it; None past the deadline."""
        end = time.monotonic() + ORDER_DEADLINE
        pause = BACK_OFF[0]
        while time.monotonic() < end:
            port = self.rng.choice(self.ports)
            try:
                async with self.slots:
                    self.driven.requests += 1
                    response = await self.http.post(
                        f"http://127.0.0.1:{port}/orders",
                        json=order.body,
                        headers={"Idempotency-Key": order.key},
                    )
            except httpx.TransportError as exc:
                self.driven.lost_answers[type(exc).__name__] += 1
            else:
                answer = _answer(response)
                if answer is not None:
                    return answer
                self.driven.lost_answers[f"HTTP {response.status_code}"] += 1
            await asyncio.sleep(pause * self.rng.uniform(0.5, 1.0))
            pause = min(BACK_OFF[1], pause * 2)
        return None

    async def close(self) -> None:
        await self.http.aclose()


def _answer(response: httpx.Response) -> Answer | None:
    """The endpoint's own answer, or None for anything to send again."""
    try:
        content = response.json()
    except ValueError:
        return None  # "Internal Server Error": PostgreSQL away, a broken pooled connection
    if response.status_code in (200, 201) and isinstance(content, dict):
        return Answer(response.status_code, content.get("message_id"))
    if response.status_code == 500 and content == {"error": ROLLED_BACK}:
        return Answer(500, None)
    return None


async def drive(orders: list[Order], ports: list[int], rate: float, rng: random.Random) -> Driven:
    """Send every order at ``rate`` orders/s, each until answered, repeats after."""
    driven = Driven()
    client = Client(ports, rng, driven)
    began = time.monotonic()

    async def one(n: int, order: Order) -> None:
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
        answers = driven.answers.setdefault(order.key, [])
        for _ in range(2 if order.repeat else 1):
            answer = await client.until_answered(order)
            if answer is None:
                driven.unanswered.append(order.key)
                return
            answers.append(answer)

    try:
        await asyncio.gather(*(one(n, order) for n, order in enumerate(orders)))
    finally:
        await client.close()
    driven.wall = time.monotonic() - began
    return driven
