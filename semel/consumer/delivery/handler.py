"""The user's handler: loading it, the context it gets, and calling it.

An async handler is awaited on the event loop; a plain one runs on a thread
of its own (see :func:`start_in_thread`). Running it under a lease is
:mod:`semel.consumer.delivery.lease`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from semel.consumer.errors import HandlerLoadError

Handler = Callable[["Context"], Any]


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
    # The body as a typed handler's annotation validated it (see
    # semel.consumer.delivery.typed); None for a handler that takes the context.
    validated: Any = None


def load_target(spec: str, app_dir: str = ".") -> Any:
    """Import ``package.module:attribute`` (a handler, or an app of several), looking
    in ``app_dir`` first, as uvicorn does.

    The ``semel`` script's own folder, not the one it is started in, heads the
    import path, so a handler in the user's project folder would not be found.
    semel's modules all live under ``semel``, so a project's own top-level
    ``settings.py`` or ``stores.py`` is its own, whichever is imported first.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise HandlerLoadError(
            f"SEMEL_HANDLER: {spec!r} is not 'package.module:callable' (or :app)"
        )
    folder = os.path.abspath(app_dir)
    if not os.path.isdir(folder):
        raise HandlerLoadError(f"SEMEL_APP_DIR: {app_dir!r} is not a folder")
    if sys.path[:1] != [folder]:
        sys.path.insert(0, folder)
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
    return target


def load_handler(spec: str, app_dir: str = ".") -> Handler:
    """The callable ``package.module:callable`` names (see :func:`load_target`)."""
    target = load_target(spec, app_dir)
    if not callable(target):
        raise HandlerLoadError(f"SEMEL_HANDLER: {spec!r} is not callable")
    handler: Handler = target
    return handler


def is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def start_in_thread(
    handler: Handler, context: Context, ended: Callable[[], None]
) -> asyncio.Future[Any]:
    """Run a plain handler on a daemon thread of its own; the future its outcome lands in.

    Not asyncio.to_thread: its executor threads are joined at interpreter
    exit, so one stuck handler would keep a stopping worker alive forever. A
    daemon thread is abandoned at exit instead, and dies with the process. The
    thread cannot be cancelled: :func:`semel.consumer.delivery.lease.run_leased` keeps
    the key owned until it ends. ``ended`` is called on the thread the moment
    the handler has returned or raised, before the event loop hears of it.
    """
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
        finally:
            ended()
        # RuntimeError: the loop closed while the handler ran; nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(target=target, name="semel-handler", daemon=True).start()
    return future


async def result_of(finished: asyncio.Future[Any]) -> Any:
    """The result of a thread that ended (its exception raised)."""
    result = finished.result()
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        result = await result
    return result
