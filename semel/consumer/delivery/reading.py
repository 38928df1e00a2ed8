"""Reading a delivery: which handler it goes to, its body, its key (as the store
keeps it), and the facts carried onto its copies. What cannot be read is a
:class:`BadMessage`, dead-lettered without a claim."""

from __future__ import annotations

import time
from dataclasses import replace

from semel.consumer.delivery.facts import Delivery, Facts, attempt_of, first_seen, origin
from semel.consumer.delivery.message import Incoming, Parsed, best_effort_key, parse
from semel.consumer.delivery.routes import Route, Routes
from semel.consumer.errors import BadMessage


def read(message: Incoming, routes: Routes, queue: str) -> tuple[Delivery, Parsed | BadMessage]:
    """Find the handler, parse the body and find the key; the facts either way."""
    started = time.monotonic()
    headers = dict(message.headers)  # the one copy; the handler's context gets it too
    route_of = origin(headers, message.exchange or "", message.routing_key or "", queue)
    rules = routes.default_rules
    route: Route | None = None
    parsed: Parsed | BadMessage
    key: str | None = None
    try:
        route = routes.pick(route_of.routing_key, message.type)
        rules = route.rules
        parsed = parse(
            message.body,
            message.content_type,
            headers,
            message.message_id,
            source=rules.source,
            limit=rules.max_body_bytes,
        )
        if route.scope:
            parsed = replace(parsed, key=route.store_key(parsed.key))
        key = parsed.key
        if route.body is not None:
            # Deterministic, so never claimed, like a malformed body: to the DLQ.
            parsed = route.body.validate(parsed)
    except BadMessage as bad:
        parsed = bad
        if key is None:
            key = best_effort_key(headers, message.message_id, rules.source)
            if key is not None and route is not None:
                key = route.store_key(key)
    facts = Facts(key, attempt_of(headers), route_of, first_seen(headers))
    return Delivery(message, facts, headers, started, route=route), parsed
