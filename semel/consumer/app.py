"""An application of several handlers, declared with a decorator each::

    from semel.consumer import App, Context

    app = App()

    @app.handler("orders.paid")
    async def charge(order: OrderPaid) -> dict[str, str]: ...

    @app.handler("orders.*.shipped", "orders.resent", max_attempts=3, time_limit=60)
    def notify(context: Context) -> None: ...

Run it with ``semel consume myservice.app:app`` (or ``SEMEL_HANDLER``).
Every handler gets a queue of its own, ``<SEMEL_QUEUE>.<name>``, bound to
``SEMEL_EXCHANGE`` with its patterns, with its own retry tiers, conflict queue
and DLQ, and its own prefetch: a slow handler's backlog never holds up the
others' deliveries. Handlers that give the same ``queue`` (the part after
``<SEMEL_QUEUE>.``) share it (and its retry tiers) and are chosen by routing
key and ``type``, in the order they were declared. A handler's keys are kept
in the store under its name, so two handlers that receive the same event each
run it once.

Only the declaration lives here; :mod:`semel.consumer.plan` turns it into
queues and routes with the settings it runs under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from semel.consumer.delivery.message import KeySource

F = TypeVar("F", bound=Callable[..., Any])

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A topic pattern: dot-separated words, each a literal, '*' or '#'.
_WORD = re.compile(r"^(\*|#|[^.*#]+)$")


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One ``@app.handler``: its function, what it receives, and what differs from
    the defaults (``None``: the setting's value)."""

    name: str
    function: Callable[..., Any]
    patterns: tuple[str, ...]
    message_type: str | None = None
    queue: str | None = None  # its queue is <SEMEL_QUEUE>.<queue>; default: its name
    key_source: str | None = None
    retry_delays: tuple[float, ...] | None = None
    max_attempts: int | None = None
    time_limit: float | None = None
    prefetch: int | None = None
    key_scope: str | None = None  # default "<name>:"


def check_pattern(pattern: str) -> str:
    """``pattern`` if a topic exchange accepts it as a binding key, else ``ValueError``."""
    if not pattern or not all(_WORD.match(word) for word in pattern.split(".")):
        raise ValueError(
            f"{pattern!r} is not a routing-key pattern (dot-separated words, '*' or '#')"
        )
    return pattern


class App:
    """The handlers of one service, each bound to the routing keys it handles."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

    @property
    def handlers(self) -> tuple[HandlerSpec, ...]:
        return tuple(self._specs.values())

    def handler(
        self,
        *patterns: str,
        type: str | None = None,  # the AMQP property's own name
        name: str | None = None,
        queue: str | None = None,
        key_source: str | None = None,
        retry_delays: Sequence[float] | None = None,
        max_attempts: int | None = None,
        time_limit: float | None = None,
        prefetch: int | None = None,
        key_scope: str | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function for deliveries whose routing key matches
        one of ``patterns`` (and whose ``type`` property is ``type``, if given).

        The options override the settings for this handler alone: ``key_source``
        (as ``SEMEL_KEY_SOURCE``), ``retry_delays`` and ``max_attempts`` (as
        ``SEMEL_RETRY_DELAYS`` / ``SEMEL_MAX_ATTEMPTS``), ``time_limit`` (as
        ``SEMEL_HANDLER_TIMEOUT``), ``prefetch``; ``key_scope`` replaces the
        ``"<name>:"`` its keys are stored under (``""`` shares the key space of
        ``SEMEL_HANDLER`` or of other handlers); ``queue`` replaces the name in
        its queue's, ``<SEMEL_QUEUE>.<name>``, and handlers giving the same one
        share that queue. The function is returned as it
        is, so it stays callable in tests.
        """
        if not patterns:
            raise ValueError("@app.handler needs at least one routing-key pattern, e.g. 'orders.#'")
        checked = tuple(check_pattern(p) for p in patterns)
        if queue is not None and not NAME.match(queue):
            raise ValueError(f"queue {queue!r}: letters, digits, '_' and '-' only")
        if key_source is not None:
            KeySource.parse(key_source)  # a bad one fails at import, naming itself
        _check_numbers(retry_delays, max_attempts, time_limit, prefetch)

        def register(function: F) -> F:
            handler_name: str = name or str(getattr(function, "__name__", ""))
            if not NAME.match(handler_name):
                raise ValueError(
                    f"handler name {handler_name!r}: letters, digits, '_' and '-' only "
                    "(give one with name=...)"
                )
            if handler_name in self._specs:
                raise ValueError(f"two handlers are named {handler_name!r}: give one a name=...")
            self._specs[handler_name] = HandlerSpec(
                name=handler_name,
                function=function,
                patterns=checked,
                message_type=type,
                queue=queue,
                key_source=key_source,
                retry_delays=None if retry_delays is None else tuple(retry_delays),
                max_attempts=max_attempts,
                time_limit=time_limit,
                prefetch=prefetch,
                key_scope=key_scope,
            )
            return function

        return register


def _check_numbers(
    retry_delays: Sequence[float] | None,
    max_attempts: int | None,
    time_limit: float | None,
    prefetch: int | None,
) -> None:
    if retry_delays is not None and (not retry_delays or any(d <= 0 for d in retry_delays)):
        raise ValueError("retry_delays: one or more delays, each greater than 0")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError("max_attempts: at least 1")
    if time_limit is not None and time_limit <= 0:
        raise ValueError("time_limit: seconds, greater than 0")
    if prefetch is not None and not 1 <= prefetch <= 65535:
        raise ValueError("prefetch: 1 to 65535")
