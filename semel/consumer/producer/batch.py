"""A batch of publishes: in order, a bounded window of unconfirmed ones in flight.

Each message is started once a slot of the window is free, and holds it until
its receipt (retries included). A message that shares its message id with an
earlier one waits for that one's receipt before it starts, which keeps the
batch's order too. The first message left without an answer stops the batch:
those in flight end with their own receipts, the rest are never sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from semel.consumer.producer.receipt import NO_ANSWER, Answer, Prepared, Receipt

NOT_SENT = "not sent: an earlier message of the batch got no answer"

Deliver = Callable[[Prepared, str], Awaitable[Receipt]]


class Batch:
    """One run of :meth:`Publisher.publish_prepared`."""

    def __init__(self, deliver: Deliver, window: int, on_settled: Callable[[], None]) -> None:
        self.deliver = deliver
        self.slots = asyncio.Semaphore(window)
        self.on_settled = on_settled
        self.stopped = False

    async def run(
        self, messages: Sequence[Prepared], ids: Sequence[str], rate: float
    ) -> list[Receipt]:
        receipts: list[Receipt | None] = [None] * len(messages)
        started: dict[str, asyncio.Task[None]] = {}  # the last publish of each message id
        tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        began = loop.time()
        for index, (message, message_id) in enumerate(zip(messages, ids, strict=True)):
            if rate > 0:
                await asyncio.sleep(max(0.0, began + index / rate - loop.time()))
            earlier = started.get(message_id)
            if earlier is not None:
                await asyncio.wait([earlier])
            await self.slots.acquire()
            if self.stopped:
                self.slots.release()
                break
            task = asyncio.create_task(self._one(message, message_id, receipts, index))
            started[message_id] = task
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            task.result()  # a defect (not a broker's answer) is raised, not hidden in a receipt
        return [
            receipt or Receipt(message_id, message.key, Answer.FAILED, 0, NOT_SENT)
            for receipt, message, message_id in zip(receipts, messages, ids, strict=True)
        ]

    async def _one(
        self, message: Prepared, message_id: str, receipts: list[Receipt | None], index: int
    ) -> None:
        try:
            receipt = receipts[index] = await self.deliver(message, message_id)
            if receipt.answer in NO_ANSWER:
                self.stopped = True
        except BaseException:
            self.stopped = True
            raise
        finally:
            self.slots.release()
            self.on_settled()
