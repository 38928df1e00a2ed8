"""The user's handler: loading it, the context it gets, and running it under a lease.

A claim is a lease of ``SEMEL_LOCK_TTL`` seconds. While the handler runs, a
heartbeat renews it every third of that; if the store answers that the claim
was taken over, the handler is cancelled at once and nothing more is written
for it (the new owner owns the key). If the store cannot be reached, the
heartbeat keeps trying until the lease would have run out, then gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stores.base import Store
from stores.errors import StoreUnavailable

Handler = Callable[["Context"], Any]
HEARTBEATS_PER_LEASE = 3
_CANCEL_WAIT = 5.0  # seconds an async handler gets to honour a cancellation


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler is called with."""

    key: str
    body: dict[str, Any]
    headers: Mapping[str, Any]
    routing_key: str
    message_id: str | None
    attempt: int  # 1-based
    fence: int  # grows with every claim of the key; hand it to fenced downstream writes


class HandlerLoadError(Exception):
    """``SEMEL_HANDLER`` does not name a callable that can be imported."""


class LeaseLost(Exception):
    """The claim was taken over while the handler ran; the new owner decides."""


class HandlerTimeout(Exception):
    """The handler ran longer than ``SEMEL_HANDLER_TIMEOUT``; a failed attempt."""


def load_handler(spec: str) -> Handler:
    """Import ``package.module:callable``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise HandlerLoadError(f"SEMEL_HANDLER: {spec!r} is not 'package.module:callable'")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import-time error is the handler's, reported in one line
        raise HandlerLoadError(f"SEMEL_HANDLER: cannot import {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerLoadError(
                f"SEMEL_HANDLER: {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise HandlerLoadError(f"SEMEL_HANDLER: {spec!r} is not callable")
    handler: Handler = target
    return handler


def is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


async def invoke(handler: Handler, context: Context) -> Any:
    """Await an async handler; run a plain one on its own thread."""
    if is_async(handler):
        return await handler(context)
    return await _in_daemon_thread(handler, context)


async def _in_daemon_thread(handler: Handler, context: Context) -> Any:
    # Not asyncio.to_thread: its executor threads are joined at interpreter
    # exit, so one stuck handler would keep a stopping worker alive forever.
    # A daemon thread is abandoned at exit instead; its claim is released and
    # its fence keeps any late write out.
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    variables = contextvars.copy_context()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            result = variables.run(handler, context)
        except BaseException as exc:  # handed to the awaiting coroutine, whatever it is
            outcome: tuple[Callable[[Any], None], Any] = (future.set_exception, exc)
        else:
            outcome = (future.set_result, result)
        # RuntimeError: the loop closed while the handler ran; nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(target=target, name="semel-handler", daemon=True).start()
    result = await future
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        result = await result
    return result


@dataclass(slots=True)
class Lease:
    """This worker's hold on a key, as far as it knows (monotonic clock)."""

    key: str
    fence: int
    ttl: float
    renewed_at: float

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.ttl

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()


async def keep_alive(store: Store, lease: Lease, stopped: asyncio.Event) -> None:
    """Renew ``lease`` until ``stopped``; return early only by raising why it was lost.

    ``stopped`` is checked around every call because a cancellation can be
    lost when it lands as a store call completes (asyncio.wait_for inside
    client libraries, Python < 3.12); a heartbeat must never outlive its run.
    """
    interval = lease.ttl / HEARTBEATS_PER_LEASE
    delay = interval
    while not stopped.is_set():
        await asyncio.sleep(delay)
        if stopped.is_set():
            return
        try:
            sent_at = time.monotonic()
            renewed = await store.heartbeat(lease.key, lease.fence)
        except StoreUnavailable:
            # Keep trying while the lease still holds; past it another worker
            # may own the key, so this one must stop.
            if lease.remaining() <= 0:
                raise
            delay = min(interval / 2, max(lease.remaining(), 0.01))
            continue
        if stopped.is_set():
            return
        if not renewed:
            raise LeaseLost(f"claim of fence {lease.fence} was taken over")
        lease.renewed_at = sent_at
        delay = interval


async def run_leased(
    handler: Handler, context: Context, store: Store, lease: Lease, time_limit: float
) -> Any:
    """The handler's result, or its exception, :class:`HandlerTimeout`,
    :class:`LeaseLost` or :class:`StoreUnavailable` (the lease could not be kept).
    """
    stopped = asyncio.Event()
    work = asyncio.ensure_future(invoke(handler, context))
    heartbeat = asyncio.ensure_future(keep_alive(store, lease, stopped))
    for task in (work, heartbeat):
        task.add_done_callback(_retrieve)
    try:
        done, _ = await asyncio.wait(
            {work, heartbeat}, timeout=time_limit, return_when=asyncio.FIRST_COMPLETED
        )
        if work in done:
            return work.result()
        if heartbeat in done:
            heartbeat.result()  # raises LeaseLost or StoreUnavailable
        raise HandlerTimeout(f"handler ran longer than {time_limit:g}s")
    finally:
        # The heartbeat stops before the caller writes the outcome, so no late
        # renewal can hold a released key.
        stopped.set()
        for task in (work, heartbeat):
            task.cancel()
        await asyncio.wait({work, heartbeat}, timeout=_CANCEL_WAIT)


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Outcomes of tasks cut short are deliberately dropped; asyncio would
    # otherwise log them as "never retrieved".
    if not task.cancelled():
        task.exception()
