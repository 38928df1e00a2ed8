"""A stop, step by step, each step within its time: the relay's, and a
broker connection's close.

``asyncio.wait_for`` alone does not bound a step: past its timeout it cancels
the step and then waits, with no bound, for it to unwind, and a client's
clean-up on cancellation can take long (psycopg asks the server to cancel a
statement and waits up to ten seconds for it; a robust AMQP connection caught
reconnecting waits for its reconnect task). Python 3.11's also loses a
cancellation that arrives as the step finishes. :func:`within` waits with
:func:`asyncio.wait` instead: past its time the step is cancelled, given
:data:`UNWIND` seconds to unwind and, if that is not enough, left behind.
Either way one warning names the step.

What no step can bound (a task that ignores cancellation when the event loop
closes, the interpreter's own exit) is bounded by :func:`exit_after`: a
stopping process exits once its time is up, naming the step it was in.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Awaitable
from typing import Any

import structlog

UNWIND = 1.0  # seconds a step cut short gets to unwind before it is left behind

log = structlog.get_logger("semel.stop")

_steps: list[str] = []  # the steps under way, innermost last: what a warning names
_behind: set[asyncio.Future[Any]] = set()  # steps left behind, referenced until they end


def current() -> str:
    """The step under way, as :func:`exit_after`'s warning names it."""
    return _steps[-1] if _steps else "the event loop's close or the interpreter's exit"


async def within(seconds: float, step: str, awaitable: Awaitable[Any]) -> bool:
    """Await ``awaitable`` for at most ``seconds``; whether it ended in time.

    Past that it is cancelled, given :data:`UNWIND` seconds, then left behind,
    and one warning names ``step``. What it raised in time is raised here
    (a cancellation of its own counts as an end, and is not raised).
    """
    future = asyncio.ensure_future(awaitable)
    _steps.append(step)
    try:
        done, _ = await asyncio.wait({future}, timeout=seconds)
        if not done:
            future.cancel()
            await asyncio.wait({future}, timeout=UNWIND)
    except asyncio.CancelledError:
        future.cancel()
        _leave_behind(future)
        raise
    finally:
        _steps.remove(step)
    if done:
        if not future.cancelled():
            future.result()
        return True
    log.warning("stop step cut short", step=step, limit=seconds, unwound=future.done())
    _leave_behind(future)
    return False


def _leave_behind(future: asyncio.Future[Any]) -> None:
    if future.done():
        _consume(future)
        return
    _behind.add(future)
    future.add_done_callback(_consume)


def _consume(future: asyncio.Future[Any]) -> None:
    # Nobody awaits a step left behind: its outcome is read so none is reported as lost.
    _behind.discard(future)
    if not future.cancelled():
        future.exception()


def exit_after(seconds: float, code: int = 0) -> threading.Timer:
    """Make the process exit with ``code`` in ``seconds`` unless it has by then.

    Started when a stop is requested: a thread, so an event loop that never
    gets to its end, or an interpreter stuck on its way out, is no hindrance.
    It says which step was under way before it exits.
    """

    def expire() -> None:
        log.warning("stop not finished in time, exiting", limit=seconds, step=current())
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer
