"""Declaring an app and planning its queues: patterns matched as the broker matches
them, declarations refused with a clear line, each handler's own settings checked."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import aio_pika
import pytest

from semel.consumer import App, Context
from semel.consumer.delivery.routes import topic_matches
from semel.consumer.errors import ConfigurationError, HandlerLoadError
from semel.consumer.plan import plans_for, required_target
from semel.settings import Settings
from tests.servers import ROOT

pytestmark = pytest.mark.timeout(60)

PATTERNS = ["orders.paid", "orders.*", "orders.#", "#", "*.paid", "#.paid", "a.#.z", "*", "a.*.#"]
KEYS = ["orders.paid", "orders", "orders.eu.paid", "paid", "a.z", "a.b.c.z", "", "a.b", "x.a.z"]


async def test_patterns_match_as_the_brokers_topic_exchange_matches_them(
    rabbitmq_server: str,
) -> None:
    """Every pattern against every key, on a real topic exchange and in semel."""
    connection = await aio_pika.connect(rabbitmq_server)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            f"t.{uuid.uuid4().hex[:8]}.topics", aio_pika.ExchangeType.TOPIC, auto_delete=True
        )
        queues = {}
        for pattern in PATTERNS:
            queue = await channel.declare_queue(exclusive=True)
            await queue.bind(exchange, pattern)
            queues[pattern] = queue
        for key in KEYS:
            await exchange.publish(aio_pika.Message(key.encode() or b"-"), routing_key=key)
        for pattern, queue in queues.items():
            got = set()
            while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
                got.add(message.body.decode())
            expected = {key or "-" for key in KEYS if topic_matches(pattern, key)}
            assert got == expected, pattern
    finally:
        await connection.close()


def handler(context: Context) -> None:
    pass


@pytest.mark.parametrize(
    ("patterns", "options", "message"),
    [
        ((), {}, "at least one routing-key pattern"),
        (("orders..paid",), {}, "is not a routing-key pattern"),
        (("orders.pa*",), {}, "is not a routing-key pattern"),
        (("orders.paid",), {"key_source": "cookie:x"}, "unknown key source"),
        (("orders.paid",), {"max_attempts": 0}, "max_attempts"),
        (("orders.paid",), {"retry_delays": []}, "retry_delays"),
        (("orders.paid",), {"queue": "a b"}, "queue 'a b'"),
        (("orders.paid",), {"name": "has space"}, "handler name 'has space'"),
    ],
)
def test_a_bad_declaration_is_refused_where_it_is_written(
    patterns: tuple[str, ...], options: dict[str, Any], message: str
) -> None:
    app = App()
    with pytest.raises(ValueError, match=message):
        app.handler(*patterns, **options)(handler)


def test_two_handlers_of_one_name_are_refused() -> None:
    app = App()
    app.handler("a")(handler)
    with pytest.raises(ValueError, match="two handlers are named 'handler'"):
        app.handler("b")(handler)


def test_each_handler_gets_its_queue_and_shared_queues_get_every_tier(
    make_settings: Any,
) -> None:
    settings: Settings = make_settings(queue="svc", retry_delays="1,5")
    app = App()
    app.handler("orders.paid", "orders.resent")(handler)
    app.handler("orders.#", name="audit", queue="misc", retry_delays=[2])(handler)
    app.handler("users.#", name="users", queue="misc", prefetch=7, time_limit=9)(handler)
    own, misc = plans_for(app, settings)
    assert own.topology.queue == "svc.handler"
    assert own.topology.binding_keys == ("orders.paid", "orders.resent")
    assert own.topology.retry_delays == (1.0, 5.0)
    assert misc.topology.queue == "svc.misc"
    assert misc.topology.binding_keys == ("orders.#", "users.#")
    assert misc.topology.retry_delays == (2.0, 1.0, 5.0)  # every tier its handlers use
    assert misc.worker.prefetch == 7 == misc.pipeline.in_flight
    audit, users = misc.routes.all
    assert (audit.retry.delays, users.retry.delays) == ((2.0,), (1.0, 5.0))
    assert (audit.scope, users.scope, users.handler_timeout) == ("audit:", "users:", 9.0)


def test_a_handlers_own_settings_are_checked_as_a_whole(make_settings: Any) -> None:
    settings: Settings = make_settings(retention=100)
    app = App()
    app.handler("a", retry_delays=[60], max_attempts=5)(handler)
    with pytest.raises(ConfigurationError, match=r"handler 'handler': SEMEL_RETENTION: 100s"):
        plans_for(app, settings)


def test_an_app_without_handlers_and_a_target_of_another_kind_are_refused() -> None:
    with pytest.raises(HandlerLoadError, match="the app has no handlers"):
        plans_for(App(), Settings())
    with pytest.raises(HandlerLoadError, match="neither a callable nor a semel App"):
        required_target("tests.consumer.test_app_plan:PATTERNS", ".")


def test_consume_takes_the_app_as_its_argument() -> None:
    """``semel consume TARGET`` loads TARGET, over SEMEL_HANDLER: a missing one says so."""
    done = subprocess.run(
        [sys.executable, "-m", "semel", "consume", "tests.consumer.app_handlers:absent"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "SEMEL_HANDLER": "semel.consumer.examples:order_paid"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "has no attribute 'absent'" in done.stderr
