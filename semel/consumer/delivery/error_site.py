"""Where a handler's failure came from: the exception's type and the handler's own frame.

A dead letter that a handler's exception sent to ``Q.dlq`` carries both
(``x-semel-error-type``, ``x-semel-error-frame``), so dead letters can be
grouped by what failed where without reading their bodies or the store.

The frame is the handler's own code, not the line that raised: during an
outage every ``httpx.ConnectError`` is raised on the same line inside httpx
(and that line moves with httpx's version), while the handler's line that made
the call tells one downstream from another. The rule, in order:

1. The innermost traceback frame inside the handler's own top-level package
   (``shop`` for ``shop.handlers:charge``): the last application line on the
   way to the failure, e.g. ``shop.payments:Client.charge:42`` under
   ``shop.handlers:charge``. Searched in the exception's own traceback, then in
   the exceptions it was raised from or during: a ``HandlerTimeout`` is raised
   by semel, but the cancellation it replaced ran through the handler's line
   that was waiting.
2. Otherwise (no frame of that package, or a handler whose package cannot be
   told), the outermost frame that is neither semel's nor the standard
   library's (asyncio and threading among them): the first code after semel
   called the handler.
3. Otherwise no frame (a plain handler's timeout: its thread's stack is not
   known); the type alone.

Frames are told apart by the module each one runs in, not by file paths, so
an application installed into ``site-packages`` is recognised all the same.
The line is part of the frame: two calls in one function that fail alike are
two groups, at the price of a deploy that moves the line starting a new one.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from semel.consumer.names import ERROR_FRAME_LIMIT, ERROR_TYPE_LIMIT

_OWN_PACKAGE = "semel"
# Exceptions followed through __cause__ / __context__ before giving up on rule 1.
_CHAIN_DEPTH = 5
_UNKNOWN_MODULE = "?"


@dataclass(frozen=True, slots=True)
class ErrorSite:
    """``x-semel-error-type`` and ``x-semel-error-frame``, bounded."""

    error_type: str  # the exception's qualified class name: httpx.ConnectError, ValueError
    frame: str | None  # module:function:line of the handler's own frame, if one is known


def error_site(exc: BaseException, handler: Callable[..., Any] | None) -> ErrorSite:
    """Where ``exc``, raised by ``handler`` (or by semel around it), came from."""
    return ErrorSite(qualified_type(exc), _frame(exc, handler))


def qualified_type(exc: BaseException) -> str:
    """``module.QualName`` of the exception's class; builtins by their bare name."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return _bounded(name, ERROR_TYPE_LIMIT)


def home_package(handler: Callable[..., Any] | None) -> str | None:
    """The top-level package of the code ``handler`` is, through semel's and
    ``functools.wraps``-style wrappers; ``None`` when it is semel's or the
    standard library's (nothing to tell the application's frames by)."""
    if handler is None:
        return None
    target: Any = inspect.unwrap(handler)
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    module = getattr(target, "__module__", None)
    if not isinstance(module, str) and not inspect.isroutine(target):
        module = type(target).__module__  # a callable object
    if not isinstance(module, str):
        return None
    package = _top(module)
    return None if _foreign(package) else package


def _frame(exc: BaseException, handler: Callable[..., Any] | None) -> str | None:
    package = home_package(handler)
    if package is not None:
        for link in _chain(exc):
            inside = [
                (frame, line)
                for frame, line in _frames(link.__traceback__)
                if _top(_module(frame)) == package
            ]
            if inside:
                return _format(*inside[-1])
    for frame, line in _frames(exc.__traceback__):
        if not _foreign(_top(_module(frame))):
            return _format(frame, line)
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or during, a few links deep."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < _CHAIN_DEPTH:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _frames(tb: TracebackType | None) -> Iterator[tuple[FrameType, int]]:
    """Outermost first, each frame with the line it was at."""
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _module(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else _UNKNOWN_MODULE


def _top(module: str) -> str:
    return module.partition(".")[0]


def _foreign(package: str) -> bool:
    """semel's own or the standard library's: never the application's frame."""
    return package in (_OWN_PACKAGE, _UNKNOWN_MODULE) or package in sys.stdlib_module_names


def _format(frame: FrameType, line: int) -> str:
    return _bounded(f"{_module(frame)}:{frame.f_code.co_qualname}:{line}", ERROR_FRAME_LIMIT)


def _bounded(text: str, limit: int) -> str:
    """At most ``limit`` UTF-8 bytes, never cutting a character in half."""
    return text.encode("utf-8", "backslashreplace")[:limit].decode("utf-8", "ignore")
