"""Fixtures and probes of the operations tests: the consumer fixtures, and an HTTP client."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# The consumer tests' fixtures: a private topology per test on the real broker.
from tests.consumer.conftest import (  # noqa: F401 - fixtures are found by name
    backend,
    broker,
    consumer_settings,
    ledger,
    settings,
    start_consumer,
    store,
)

HTTP_TIMEOUT = 5.0


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def http(port: int, path: str, method: str = "GET") -> Response:
    """One request to the consumer's endpoint on 127.0.0.1, read until the server closes."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port), HTTP_TIMEOUT
    )
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), HTTP_TIMEOUT)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Response(int(status_line.split(" ", 2)[1]), headers, body)


class Samples:
    """A scrape of ``/metrics``, looked up by sample name and labels."""

    def __init__(self, text: str) -> None:
        self._values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self._values[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def get(self, name: str, **labels: str) -> float:
        """The sample's value; a missing sample fails the test with its name."""
        key = (name, frozenset(labels.items()))
        assert key in self._values, f"no sample {name}{labels}"
        return self._values[key]

    def messages(self, outcome: str, reason: str = "") -> float:
        return self.get("semel_messages_total", outcome=outcome, reason=reason)


async def scrape(port: int) -> Samples:
    response = await http(port, "/metrics")
    assert response.status == 200, response
    return Samples(response.body.decode())
