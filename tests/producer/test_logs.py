"""``Publisher.open()`` in an application that set no logging up: semel's own
lines follow ``SEMEL_LOG_LEVEL`` (info by default), as the engine's do, instead
of structlog's unconfigured default, which prints debug lines too. Run in a
process of its own: structlog's configuration is global."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.producer.conftest import Place

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
import asyncio
from semel import Publisher

async def main() -> None:
    async with Publisher.open() as publisher:
        assert (await publisher.publish({"a": 1}, key="k-1", routing_key="order.paid")).ok

asyncio.run(main())
"""


def run_app(place: Place, **env: str) -> str:
    """What the application printed (structlog's default prints to stdout, semel's to stderr)."""
    inherited = {k: v for k, v in os.environ.items() if k != "SEMEL_LOG_LEVEL"}
    environment = inherited | {
        "SEMEL_AMQP_URL": place.url, "SEMEL_EXCHANGE": place.exchange, **env
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True,
        timeout=45, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_an_application_without_logging_set_up_gets_no_debug_lines(place: Place) -> None:
    assert "connected to the broker" in run_app(place, SEMEL_LOG_LEVEL="debug")
    assert "debug" not in run_app(place)
