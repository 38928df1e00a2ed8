"""``SyncPublisher``: the publisher for code that does not run an event loop.

Django views, Flask handlers, Celery tasks and scripts call it from any
thread; every call runs on one event loop in a thread of the publisher's own,
on one connection, and blocks until its receipt. :meth:`SyncPublisher.close`
closes the connection, then stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Self, TypeVar

from semel.consumer.delivery.message import KeySource
from semel.consumer.names import CONFIRM_TIMEOUT
from semel.consumer.producer.publisher import (
    CONNECT_GIVE_UP,
    DEFAULT_SOURCE,
    PUBLISH_WINDOW,
    Publisher,
)
from semel.consumer.producer.receipt import Message, Receipt
from semel.consumer.producer.retry import Retry
from semel.stores.base import JSON

T = TypeVar("T")
THREAD_NAME = "semel-publisher"


class SyncPublisher:
    """A :class:`Publisher` behind blocking, thread-safe calls.

    ``with SyncPublisher.connect(url, exchange=...) as publisher:``, or keep
    one for the life of the process and :meth:`close` it at exit.
    """

    def __init__(
        self, publisher: Publisher, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        # Use start() or connect(): they make the loop, its thread and the publisher.
        self._publisher = publisher
        self._loop = loop
        self._thread = thread
        self._closing = threading.Lock()
        self._closed = False

    @classmethod
    def start(cls, opener: Callable[[], Awaitable[Publisher]]) -> Self:
        """Start the loop's thread and open the publisher ``opener`` gives on it;
        what ``opener`` raises is raised here, with the thread stopped."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=THREAD_NAME, daemon=True)
        thread.start()

        async def opened() -> Publisher:
            return await opener()

        try:
            publisher = asyncio.run_coroutine_threadsafe(opened(), loop).result()
        except BaseException:
            _stop(loop, thread)
            raise
        return cls(publisher, loop, thread)

    @classmethod
    def connect(
        cls,
        addresses: str | Sequence[str],
        *,
        exchange: str = "",
        key_source: str | KeySource = DEFAULT_SOURCE,
        give_up: float = CONNECT_GIVE_UP,
        retry: Retry | None = None,
        window: int = PUBLISH_WINDOW,
        confirm_timeout: float = CONFIRM_TIMEOUT,
    ) -> Self:
        """:meth:`Publisher.connect`, blocking: returns once connected."""

        async def opener() -> Publisher:
            return await Publisher.connect(
                addresses,
                exchange=exchange,
                key_source=key_source,
                give_up=give_up,
                retry=retry,
                window=window,
                confirm_timeout=confirm_timeout,
            )

        return cls.start(opener)

    def publish(
        self,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = None,
    ) -> Receipt:
        """:meth:`Publisher.publish`, blocking until the receipt."""
        # The key is placed here, in the caller's thread: a bad one raises at once.
        prepared = self._publisher.prepare(
            body,
            key=key,
            routing_key=routing_key,
            headers=headers,
            message_id=message_id,
            content_type=content_type,
        )
        (receipt,) = self._call(lambda: self._publisher.publish_prepared([prepared]))
        return receipt

    def publish_many(
        self, messages: Iterable[Message], *, window: int | None = None
    ) -> list[Receipt]:
        """:meth:`Publisher.publish_many`, blocking until every receipt."""
        batch = list(messages)
        return self._call(lambda: self._publisher.publish_many(batch, window=window))

    def _call(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a SyncPublisher cannot be called from its own loop's thread")
        if self._closed:
            raise RuntimeError("this SyncPublisher is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(call(), self._loop)
        return future.result()

    def close(self) -> None:
        """Close the connection, stop the loop and its thread; once is enough."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._publisher.close(), self._loop).result()
        finally:
            _stop(self._loop, self._thread)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what is left on ``loop`` (the client's own tasks), stop it, join its thread."""

    async def wind_down() -> None:
        here = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not here]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await loop.shutdown_asyncgens()

    try:
        asyncio.run_coroutine_threadsafe(wind_down(), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
