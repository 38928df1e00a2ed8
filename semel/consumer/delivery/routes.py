"""Which handler a delivery goes to, and the rules it is processed by.

A worker's queue serves one or more routes. A route matches the routing key
the producer published with (read through retries and parked copies, see
:func:`semel.consumer.delivery.facts.origin`) against topic patterns, as a
topic exchange matches its bindings (``*`` one word, ``#`` zero or more), and
optionally the message's AMQP ``type`` property. The first route that matches
takes the delivery; a delivery no route matches can never be processed by
this queue's worker and goes to the DLQ as ``no-handler``.

Each route carries what may differ between handlers: where the key is read,
the retry tiers and attempts, the time limit, and the scope its keys are kept
under in the store, so two handlers that receive the same event (fan-out, one
key) each run it once rather than the second taking it for a duplicate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from semel.consumer.delivery.decide import RetryPolicy
from semel.consumer.delivery.handler import Handler, is_async
from semel.consumer.delivery.message import MessageRules
from semel.consumer.delivery.typed import BodyType, body_of
from semel.consumer.errors import BadMessage
from semel.consumer.names import Reason

MATCH_EVERYTHING = ("#",)


@functools.lru_cache(maxsize=4096)
def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether ``routing_key`` matches ``pattern`` as a topic exchange binding would."""
    # An empty routing key is no word at all: '*' does not match it, '#' does.
    words = tuple(routing_key.split(".")) if routing_key else ()
    return _match(tuple(pattern.split(".")), words)


def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        # Zero words, or one more word taken by the same '#'.
        return _match(rest, words) or (bool(words) and _match(pattern, words[1:]))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])


@dataclass(frozen=True, slots=True)
class Route:
    """One handler and how its deliveries are read, retried and timed."""

    name: str
    handler: Handler
    rules: MessageRules
    retry: RetryPolicy
    handler_timeout: float
    patterns: tuple[str, ...] = MATCH_EVERYTHING
    message_type: str | None = None  # the AMQP ``type`` property it must carry, if set
    scope: str = ""  # prepended to its keys in the store
    body: BodyType | None = field(init=False, default=None)
    # Whether the handler is a coroutine function (else it runs on a thread):
    # asked once here rather than by inspection on every delivery.
    asynchronous: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        # A typed handler's body type, validated before the claim.
        object.__setattr__(self, "body", body_of(self.handler))
        object.__setattr__(self, "asynchronous", is_async(self.handler))

    def matches(self, routing_key: str, message_type: str | None) -> bool:
        if self.message_type is not None and message_type != self.message_type:
            return False
        return any(topic_matches(pattern, routing_key) for pattern in self.patterns)

    def store_key(self, key: str) -> str:
        return self.scope + key

    def message_key(self, store_key: str) -> str:
        """The key as the message carried it (what the handler's context shows)."""
        return store_key[len(self.scope) :]


class Routes:
    """The routes of one queue, tried in the order they were declared."""

    def __init__(self, routes: Sequence[Route]) -> None:
        if not routes:
            raise ValueError("a queue needs at least one route")
        self.all = tuple(routes)
        # The rules a delivery is read by before (or without) a route: for the
        # key of a dead letter that matched none.
        self.default_rules = self.all[0].rules
        first = self.all[0]
        # One route for every delivery (SEMEL_HANDLER): nothing to match.
        self._only = (
            first
            if len(self.all) == 1
            and first.patterns == MATCH_EVERYTHING
            and first.message_type is None
            else None
        )

    @classmethod
    def single(
        cls, handler: Handler, rules: MessageRules, retry: RetryPolicy, handler_timeout: float
    ) -> Routes:
        """One handler that takes every delivery of its queue (``SEMEL_HANDLER``)."""
        return cls([Route("handler", handler, rules, retry, handler_timeout)])

    def pick(self, routing_key: str, message_type: str | None) -> Route:
        """The route of a delivery, or :class:`BadMessage` (``no-handler``)."""
        if self._only is not None:
            return self._only
        for route in self.all:
            if route.matches(routing_key, message_type):
                return route
        typed = "" if message_type is None else f" and type {message_type!r}"
        raise BadMessage(
            Reason.NO_HANDLER, f"no handler for routing key {routing_key!r}{typed} on this queue"
        )

    def mapped(self, wrap: Callable[[Route], Handler]) -> Routes:
        """The same routes, each handler replaced by ``wrap(route)``."""
        return Routes([replace(route, handler=wrap(route)) for route in self.all])
