"""``SyncPublisher`` from plain threads: one loop of its own, stopped by close()."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from semel.consumer.errors import BrokerUnavailable
from semel.consumer.producer import Message, SyncPublisher
from semel.consumer.producer.sync import THREAD_NAME
from tests.producer.conftest import ROUTING_KEY, Place

pytestmark = pytest.mark.timeout(60)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


async def test_threads_publish_through_one_publisher_then_close_stops_its_thread(
    place: Place,
) -> None:
    before = len(loop_threads())

    def run() -> list[str]:
        publisher = SyncPublisher.connect(place.url, exchange=place.exchange)
        with publisher:

            def send(thread: int) -> list[str]:
                ids = []
                for n in range(25):
                    key = f"t{thread}-{n}"
                    receipt = publisher.publish({"n": n}, key=key, routing_key=ROUTING_KEY)
                    assert receipt.ok, receipt
                    ids.append(receipt.message_id)
                return ids

            with ThreadPoolExecutor(8) as pool:
                sent = [i for ids in pool.map(send, range(8)) for i in ids]
            batch = [Message({"n": n}, key=f"b-{n}", routing_key=ROUTING_KEY) for n in range(10)]
            assert all(r.ok for r in publisher.publish_many(batch, window=4))
            assert len(loop_threads()) == before + 1
        assert publisher.closed
        assert len(loop_threads()) == before  # close() joined it
        publisher.close()  # twice is fine
        with pytest.raises(RuntimeError, match="closed"):
            publisher.publish({}, key="late", routing_key=ROUTING_KEY)
        return sent

    sent = await asyncio.to_thread(run)
    assert len(set(sent)) == 200
    assert len(await place.taken(210)) == 210


async def test_a_broker_that_never_answers_raises_at_open_and_leaves_no_thread() -> None:
    before = len(loop_threads())
    with pytest.raises(BrokerUnavailable):
        await asyncio.to_thread(
            SyncPublisher.connect, "amqp://guest:guest@127.0.0.1:1/", give_up=0.5
        )
    assert len(loop_threads()) == before


async def test_a_bad_key_raises_in_the_callers_thread(place: Place) -> None:
    def run() -> None:
        publisher = SyncPublisher.connect(place.url, exchange=place.exchange)
        with publisher, pytest.raises(ValueError, match="0 characters"):
            publisher.publish({}, key="", routing_key=ROUTING_KEY)

    await asyncio.to_thread(run)
