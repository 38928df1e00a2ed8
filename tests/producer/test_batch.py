"""Batches: order, the window of unconfirmed publishes, the stop after no answer; the retry rule."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractExchange
from aiormq.exceptions import AMQPConnectionError, DeliveryError
from pamqp.commands import Basic

from semel.consumer.commands.traffic import PublishPlan, build_messages, publish_all
from semel.consumer.delivery.message import KeySource
from semel.consumer.producer import NO_RETRY, RETRIED, Answer, Message, Publisher, Retry
from semel.consumer.producer.batch import NOT_SENT
from tests.producer.conftest import ROUTING_KEY, Place

pytestmark = pytest.mark.timeout(30)


async def test_a_batch_lands_in_order_with_one_receipt_per_message(place: Place) -> None:
    messages = [Message({"n": n}, key=f"k-{n}", routing_key=ROUTING_KEY) for n in range(300)]
    async with Publisher.connect(place.url, exchange=place.exchange) as publisher:
        receipts = await publisher.publish_many(messages, window=16)
    assert [r.key for r in receipts] == [m.key for m in messages]
    assert all(r.ok and r.attempts == 1 for r in receipts)
    assert len({r.message_id for r in receipts}) == 300
    landed = await place.taken(300)
    assert [m.headers["Idempotency-Key"] for m in landed] == [m.key for m in messages]
    assert [m.message_id for m in landed] == [r.message_id for r in receipts]


async def test_a_bad_key_anywhere_in_a_batch_sends_nothing(place: Place) -> None:
    messages = [
        Message({"n": 1}, key="k-1", routing_key="r"),
        Message({"n": 2}, key="", routing_key="r"),
    ]
    async with Publisher.connect(place.url, exchange=place.exchange) as publisher:
        with pytest.raises(ValueError, match="0 characters"):
            await publisher.publish_many(messages)
    assert await place.depth() == 0


class StandIn:
    """An exchange that answers after a moment, counting what is in flight at once;
    ``answers`` says what each publish (by its order) gets, an exception raised."""

    def __init__(
        self, answers: dict[int, BaseException] | None = None, slow: str | None = None
    ) -> None:
        self.answers = answers or {}
        self.slow = slow  # a message id answered ten times slower
        self.calls = 0
        self.in_flight: list[str] = []
        self.most = 0
        self.ids: list[str] = []
        self.overlapping_ids = False

    async def publish(self, message: Any, routing_key: str, **_: Any) -> Basic.Ack:
        self.calls += 1
        call = self.calls
        message_id = str(message.message_id)
        self.overlapping_ids |= message_id in self.in_flight
        self.ids.append(message_id)
        self.in_flight.append(message_id)
        self.most = max(self.most, len(self.in_flight))
        try:
            await asyncio.sleep(0.02 if message_id == self.slow else 0.002)
            if call in self.answers:
                raise self.answers[call]
            return Basic.Ack()
        finally:
            self.in_flight.remove(message_id)


def publisher_on(exchange: StandIn, **options: Any) -> Publisher:
    return Publisher(cast(AbstractExchange, exchange), **options)


async def test_the_window_bounds_the_unconfirmed_publishes() -> None:
    exchange = StandIn()
    messages = [Message({"n": n}, key=f"k-{n}", routing_key="r") for n in range(200)]
    receipts = await publisher_on(exchange, window=7).publish_many(messages)
    assert all(r.ok for r in receipts)
    assert exchange.most == 7
    exchange = StandIn()
    await publisher_on(exchange).publish_many(messages, window=3)
    assert exchange.most == 3


async def test_no_answer_stops_the_batch_and_the_rest_are_never_sent() -> None:
    exchange = StandIn({41: AMQPConnectionError("Server connection reset")})
    messages = [Message({"n": n}, key=f"k-{n}", routing_key="r") for n in range(100)]
    receipts = await publisher_on(exchange, retry=NO_RETRY, window=4).publish_many(messages)
    answers = [r.answer for r in receipts]
    assert answers[:40] == [Answer.CONFIRMED] * 40
    assert receipts[40].answer is Answer.FAILED
    assert receipts[40].error == "AMQPConnectionError: Server connection reset"
    sent = exchange.calls
    assert 41 <= sent <= 44  # those already in the window settle on their own
    assert all(r.attempts == 1 for r in receipts[:sent])
    assert all(
        (r.answer, r.attempts, r.error) == (Answer.FAILED, 0, NOT_SENT) for r in receipts[sent:]
    )


async def test_a_message_is_retried_under_its_id_and_the_batch_goes_on() -> None:
    exchange = StandIn({3: AMQPConnectionError("reset"), 4: DeliveryError(None, Basic.Nack())})
    messages = [Message({"n": n}, key=f"k-{n}", routing_key="r") for n in range(6)]
    quick = Retry(attempts=3, first=0.001, longest=0.001)
    receipts = await publisher_on(exchange, retry=quick, window=1).publish_many(messages)
    assert [r.attempts for r in receipts] == [1, 1, 3, 1, 1, 1]  # calls 3 and 4 are k-2's
    assert all(r.ok for r in receipts)
    assert exchange.ids[2] == exchange.ids[3] == exchange.ids[4] == receipts[2].message_id


async def test_publishes_of_one_message_id_never_overlap_and_keep_their_order() -> None:
    exchange = StandIn(slow="k-0")  # the others must not overtake its later copies
    by_id = KeySource.parse("message_id")
    publisher = publisher_on(exchange, source=by_id, window=50)
    messages = [Message({"n": n}, key=f"k-{n % 3}", routing_key="r") for n in range(30)]
    receipts = await publisher.publish_many(messages)
    assert all(r.ok for r in receipts)
    assert not exchange.overlapping_ids
    assert exchange.ids == [f"k-{n % 3}" for n in range(30)]
    # Concurrent single publishes of one id wait for each other too.
    await asyncio.gather(*(publisher.publish({}, key="same", routing_key="r") for _ in range(5)))
    assert not exchange.overlapping_ids


@pytest.mark.parametrize("answer", list(Answer))
def test_which_answers_are_retried(answer: Answer) -> None:
    retry = Retry(attempts=3)
    retried = answer in {Answer.NACKED, Answer.TIMED_OUT, Answer.FAILED}
    assert (answer in RETRIED) is retried
    assert retry.again(answer, 1) is retried
    assert retry.again(answer, 2) is retried
    assert retry.again(answer, 3) is False  # three publishes in all
    assert NO_RETRY.again(answer, 1) is False


def test_the_pauses_double_up_to_the_longest_with_jitter() -> None:
    low = Retry(attempts=9, first=0.5, longest=5.0, draw=lambda: 0.0)
    high = Retry(attempts=9, first=0.5, longest=5.0, draw=lambda: 1.0)
    assert [high.pause(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [low.pause(n) for n in range(1, 4)] == [0.25, 0.5, 1.0]
    with pytest.raises(ValueError, match="attempts >= 1"):
        Retry(attempts=0)


async def test_semel_publish_reports_each_message_once_never_retried() -> None:
    exchange = StandIn({1: AMQPConnectionError("reset")})
    plan = PublishPlan(count=3, key_prefix="p")
    messages = build_messages(plan, KeySource.parse("header:Idempotency-Key"), 4096)
    report = await publish_all(cast(AbstractExchange, exchange), messages, "r", window=1)
    assert exchange.calls == 1  # the failed one is not sent again, and the run stops
    assert (report.published, report.failed, report.not_sent) == (1, 1, 2)
    assert report.failed_keys == ["p-1"]
