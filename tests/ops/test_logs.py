"""Logs in json mode: one line per settled delivery, with what an operator needs, no bodies."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from semel.settings import LogFormat, LogLevel
from tests.consumer.conftest import ConsumerSettings
from tests.consumer.harness import Broker, processes
from tests.consumer.test_delivery import settle_all
from tests.ops.traffic import (
    BODY_MARKER,
    Traffic,
    scraped_until,
    send_duplicates,
    send_originals,
    started,
)
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("backend", ["redis"])
async def test_each_delivery_is_logged_once_as_json_and_no_body_is_logged(
    consumer_settings: ConsumerSettings, broker: Broker, tmp_path: Path
) -> None:
    settings = consumer_settings(
        metrics_port=free_port(), log_format=LogFormat.JSON, log_level=LogLevel.DEBUG
    )
    traffic = Traffic(unique=3, retried=1, bad=2, duplicates=2)
    await broker.declare(settings)
    with processes() as running:
        worker = await started(settings, tmp_path / "consumer.log")
        running.append(worker)
        await send_originals(broker, settings, traffic)
        await scraped_until(settings.metrics_port, "originals", {("processed", ""): 4})
        await send_duplicates(broker, settings, traffic)
        await scraped_until(settings.metrics_port, "duplicates", {("duplicate", ""): 2})
        await settle_all(broker, settings, dead_letters=traffic.bad)
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output()

    output = worker.output()
    lines: list[dict[str, Any]] = [json.loads(line) for line in output.splitlines()]  # all JSON
    settled = [line for line in lines if line["event"] == "settled"]
    deliveries = {
        "u-0": ["completed", "duplicate"],
        "u-1": ["completed", "duplicate"],
        "u-2": ["completed"],
        "r-0": ["retry", "completed"],  # the retry copy is a delivery of its own
        "bad-0": ["dead-letter"],
        "bad-1": ["dead-letter"],
    }
    assert Counter(line["key"] for line in settled) == {k: len(v) for k, v in deliveries.items()}
    for key, outcomes in deliveries.items():
        assert [line["outcome"] for line in settled if line["key"] == key] == outcomes, key
    for line in settled:
        # Routine outcomes at debug, the ones an operator acts on at info.
        routine = line["outcome"] in ("completed", "duplicate")
        assert line["level"] == ("debug" if routine else "info")
        assert {"key", "fence", "attempt", "outcome", "duration_ms", "timestamp"} <= line.keys()
        assert line["duration_ms"] >= 0
    assert [line["attempt"] for line in settled if line["key"] == "r-0"] == [1, 2]
    assert {line["reason"] for line in settled if line["key"].startswith("bad-")} == {
        "malformed-body"
    }
    assert all(line["fence"] is None for line in settled if line["key"].startswith("bad-"))
    assert BODY_MARKER not in output
    assert "guest:guest" not in output
