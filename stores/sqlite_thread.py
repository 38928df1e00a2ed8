"""The one thread a SQLite store runs its blocking calls on, in order.

``loop.run_in_executor`` wakes the event loop once per call, through a
concurrent future chained to an asyncio one. With hundreds of calls queued
that wake-up, not SQLite, was most of a lone claim's cost: here the thread
answers asyncio futures directly, and wakes the loop only when it is not
already due to collect answers, so a burst of calls costs one wake-up.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

A = TypeVar("A")
T = TypeVar("T")

Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[Any], Any], Any]
Answer = tuple["asyncio.Future[Any]", Any, BaseException | None]


class StoreThread:
    """Runs ``work(arg)`` calls one at a time, in the order they were submitted."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Answers not yet handed to their loop, by loop: a loop that stopped
        # with answers uncollected never holds up another loop's.
        self._answers: dict[asyncio.AbstractEventLoop, list[Answer]] = {}
        self._stopped = False
        # A daemon: a store never closed must not hold the interpreter at exit,
        # and a transaction cut short there is rolled back by SQLite.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[A], T], arg: A) -> asyncio.Future[T]:
        if self._stopped:
            raise RuntimeError("the store's thread is stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, work, arg))
        return future

    def stop(self) -> None:
        """Let the thread end once the calls already submitted have run."""
        self._stopped = True
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, work, arg = job
            if future.cancelled():  # as an executor drops a call cancelled before it ran
                continue
            try:
                answer: Answer = (future, work(arg), None)
            except BaseException as exc:  # handed to the caller, whatever it is
                answer = (future, None, exc)
            with self._lock:
                answers = self._answers.setdefault(loop, [])
                wake = not answers  # otherwise the loop is already due to collect
                answers.append(answer)
            if wake:
                try:
                    loop.call_soon_threadsafe(self._deliver, loop)
                except RuntimeError:  # the loop is closed: nobody awaits these answers
                    with self._lock:
                        del self._answers[loop]

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            answers = self._answers.pop(loop, [])
        for future, result, exc in answers:
            if future.cancelled():
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
