"""``semel.Publisher.open()`` / ``semel.SyncPublisher.open()``: settings from the
environment, settings in code winning, a bad one a one-line ConfigurationError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from semel.consumer.delivery.message import KeySource
from semel.consumer.embedded.publishing import Publisher, SyncPublisher
from semel.consumer.errors import ConfigurationError
from semel.consumer.producer import publisher as producing
from semel.settings import Settings
from tests.producer.conftest import ROUTING_KEY, Place, body_of

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, place: Place) -> pytest.MonkeyPatch:
    monkeypatch.setenv("SEMEL_AMQP_URL", place.url)
    monkeypatch.setenv("SEMEL_EXCHANGE", place.exchange)
    monkeypatch.setenv("SEMEL_KEY_SOURCE", "body:meta.key")
    return monkeypatch


async def test_the_environment_names_the_broker_the_exchange_and_the_key_source(
    env: pytest.MonkeyPatch, place: Place
) -> None:
    async with Publisher.open() as publisher:
        assert isinstance(publisher, Publisher)
        assert isinstance(publisher, producing.Publisher)
        assert publisher.exchange.name == place.exchange
        assert publisher.source == KeySource("body", "meta.key")
        assert (await publisher.publish({"a": 1}, key="k-1", routing_key=ROUTING_KEY)).ok
    (message,) = await place.taken(1)
    assert body_of(message) == {"a": 1, "meta": {"key": "k-1"}}


async def test_settings_in_code_win_over_the_environment(
    env: pytest.MonkeyPatch, place: Place
) -> None:
    env.setenv("SEMEL_EXCHANGE", "semel.nowhere")
    async with Publisher.open(exchange=place.exchange, key_source="message_id") as publisher:
        assert publisher.exchange.name == place.exchange
        receipt = await publisher.publish({"a": 1}, key="k-2", routing_key=ROUTING_KEY)
        assert receipt.ok
        assert receipt.message_id == "k-2"
    given = Settings(amqp_url=place.url, exchange=place.exchange)
    publisher = await Publisher.open(given, key_source="header:X-Key")  # awaited, closed later
    try:
        assert publisher.source == KeySource("header", "X-Key")
        assert publisher.exchange.name == place.exchange
    finally:
        await publisher.close()


async def test_the_sync_publisher_opens_from_the_environment_too(
    env: pytest.MonkeyPatch, place: Place
) -> None:
    def run() -> bool:
        with SyncPublisher.open() as publisher:
            assert isinstance(publisher, SyncPublisher)
            return publisher.publish({"a": 1}, key="k-3", routing_key=ROUTING_KEY).ok

    assert await asyncio.to_thread(run)
    (message,) = await place.taken(1)
    assert body_of(message)["meta"] == {"key": "k-3"}


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"key_source": "nowhere"}, "SEMEL_KEY_SOURCE"),
        ({"amqp_url": "http://localhost/"}, "SEMEL_AMQP_URL"),
        ({"exchange": ""}, "SEMEL_EXCHANGE"),
        ({"exchnge": "typo"}, "exchnge"),
    ],
)
def test_a_bad_setting_in_code_is_one_line_naming_it(
    overrides: dict[str, Any], variable: str
) -> None:
    for open_ in (Publisher.open, SyncPublisher.open):
        with pytest.raises(ConfigurationError) as caught:
            open_(**overrides)
        assert variable in str(caught.value)
        assert len(str(caught.value).splitlines()) == 1
    with pytest.raises(ConfigurationError, match=variable):
        Publisher.open(Settings(), **overrides)


def test_a_bad_setting_in_the_environment_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEMEL_KEY_SOURCE", "header")
    with pytest.raises(ConfigurationError, match="SEMEL_KEY_SOURCE") as caught:
        Publisher.open()
    assert len(str(caught.value).splitlines()) == 1
