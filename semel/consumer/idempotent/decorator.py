"""``idempotent(...)``: the options checked once, then a wrapper per function."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, get_args

from semel.consumer.delivery.handler import is_async
from semel.consumer.idempotent.arguments import Arguments, KeyOf
from semel.consumer.idempotent.cache import CompletedKeys
from semel.consumer.idempotent.running import InProgress, OnDuplicate, Options, Runner, StoreFor

P = ParamSpec("P")
R = TypeVar("R")


def idempotent(
    store_for: StoreFor,
    *,
    key: KeyOf,
    fields: Sequence[str] | None = None,
    expires_after: float | None = None,
    local_cache: int = 0,
    on_duplicate: OnDuplicate | None = None,
    in_progress: InProgress = "raise",
    wait_timeout: float = 10.0,
    time_limit: float | None = None,
    scope: str | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run the decorated ``async def`` effectively once per key.

    ``store_for(expires_after)`` returns an open store (the caller caches
    them: one per retention). ``key`` names the argument holding the key (a
    dotted path into it allowed) or computes it from the call's arguments;
    ``fields`` names what makes up the payload's fingerprint (all arguments
    when ``None``). ``scope`` prefixes the stored key (``"<scope>:<key>"``),
    by default the function's ``__qualname__``; ``""`` stores the key as
    given. The rest is described in ``docs/idempotent.md``.
    """
    if in_progress not in get_args(InProgress):
        raise ValueError(f"in_progress: {in_progress!r} is not one of {get_args(InProgress)}")
    for name, value in (("expires_after", expires_after), ("time_limit", time_limit)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive: {value!r}")
    if wait_timeout < 0 or local_cache < 0:
        raise ValueError("wait_timeout and local_cache cannot be negative")

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        loose: Callable[..., Any] = function  # is_async reads any callable
        if not is_async(loose):
            # A plain function's thread cannot be stopped when its lease is
            # lost; the worker then ends its process, which a library must not.
            raise TypeError(f"idempotent() takes an async def: {function!r} is not one")
        options = Options(
            store_for=store_for,
            scope=function.__qualname__ if scope is None else scope,
            expires_after=expires_after,
            on_duplicate=on_duplicate,
            in_progress=in_progress,
            wait_timeout=wait_timeout,
            time_limit=time_limit,
        )
        arguments = Arguments(function, key, fields)
        runner = Runner(function, options, arguments, CompletedKeys(local_cache))

        @functools.wraps(function)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await runner.call(args, kwargs)
            return result

        # Introspection (FastAPI, help()) sees what callers pass: no fence.
        call.__signature__ = arguments.signature  # type: ignore[attr-defined]
        return call

    return decorate
