"""A handler's own log lines: visible at ``SEMEL_LOG_LEVEL`` in both formats, each
carrying its own delivery's key, fence, attempt, message id and routing key;
the libraries semel quietens stay quiet at info; a summary says what became of
the deliveries."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from semel.settings import LogFormat, LogLevel, Settings
from tests.consumer.conftest import ConsumerSettings
from tests.consumer.harness import ROUTING_KEY, Broker, ConsumerProcess, processes
from tests.ops.log_handlers import CAUGHT, NOISY_LINE, NOISY_WARNING, USER_LOGGER
from tests.ops.traffic import scraped_until, started
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

HANDLERS = {"async": "logging_async", "def": "logging_plain"}
SUMMARY = "deliveries settled"


async def run(settings: Settings, broker: Broker, log: Path) -> ConsumerProcess:
    """Two deliveries of ``k-ok``'s and ``k-retry``'s first attempts, and the retry
    of ``k-retry``; the consumer stopped once all three have settled."""
    await broker.declare(settings)
    with processes() as running:
        worker = await started(settings, log)
        running.append(worker)
        await broker.publish(settings, {"n": 1}, key="k-ok", message_id="m-ok")
        await broker.publish(settings, {"fail_first": True}, key="k-retry", message_id="m-retry")
        await scraped_until(
            settings.metrics_port, "settled", {("processed", ""): 2, ("retried", ""): 1}
        )
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output()
    return worker


def seen(line: dict[str, Any]) -> str:
    """What the handler said it was given: ``key fence attempt``."""
    if line["event"].startswith("stdlib line"):
        return str(line["event"].partition("seen=")[2])
    return str(line["seen"])


@pytest.mark.parametrize("kind", HANDLERS)
async def test_a_handlers_own_lines_carry_its_delivery_as_json(
    consumer_settings: ConsumerSettings, broker: Broker, tmp_path: Path, kind: str
) -> None:
    settings = consumer_settings(
        metrics_port=free_port(),
        log_format=LogFormat.JSON,
        log_level=LogLevel.INFO,
        handler=f"tests.ops.log_handlers:{HANDLERS[kind]}",
    )
    worker = await run(settings, broker, tmp_path / "consumer.log")

    output = worker.output()
    lines: list[dict[str, Any]] = [json.loads(line) for line in output.splitlines()]
    stdlib = [
        line for line in lines if line.get("logger") == USER_LOGGER and line["event"] != CAUGHT
    ]
    [caught] = [line for line in lines if line["event"] == CAUGHT]
    assert (caught["key"], caught["attempt"], caught["level"]) == ("k-retry", 1, "error")
    assert "RuntimeError: first attempt fails" in caught["exception"]  # the traceback, rendered
    structured = [line for line in lines if line["event"] == "structlog line"]
    expected = {("k-ok", 1), ("k-retry", 1), ("k-retry", 2)}
    for written in (stdlib, structured):
        assert {(line["key"], line["attempt"]) for line in written} == expected, output
        assert len(written) == len(expected), output
        for line in written:
            # Its own delivery's fields, never another's (deliveries run side by side).
            assert seen(line) == f"{line['key']} {line['fence']} {line['attempt']}"
            assert line["message_id"] == line["key"].replace("k-", "m-")
            assert line["routing_key"] == ROUTING_KEY
            assert line["level"] == "info"
            assert {"timestamp"} <= line.keys()
    assert {line["event"] for line in stdlib} == {
        f"stdlib line from {kind} handler seen={line['key']} {line['fence']} {line['attempt']}"
        for line in stdlib
    }
    # A library's warning during the handler's run is the delivery's too.
    warnings = [line for line in lines if line["event"] == NOISY_WARNING]
    assert {(line["key"], line["attempt"]) for line in warnings} == expected, output
    # Bound for the handler's run only: semel's own lines after it (the retry's
    # settled line, in the same task) and around it carry none of it.
    for line in lines:
        if line in stdlib or line in structured or line in warnings or line is caught:
            continue
        assert not {"message_id", "routing_key"} & line.keys(), line
        if line["event"] != "settled":
            assert "key" not in line, line
    assert "stdlib debug line" not in output  # below SEMEL_LOG_LEVEL
    assert NOISY_LINE not in output
    assert len(warnings) == len(expected)
    summaries = [line for line in lines if line["event"] == SUMMARY]
    assert summaries, output
    assert all(line["level"] == "info" for line in summaries)
    assert sum(line.get("completed", 0) for line in summaries) == 2
    assert sum(line.get("retry", 0) for line in summaries) == 1
    assert sum(line["total"] for line in summaries) == 3


async def test_a_plain_handlers_lines_in_console_format_at_debug(
    consumer_settings: ConsumerSettings, broker: Broker, tmp_path: Path
) -> None:
    settings = consumer_settings(
        metrics_port=free_port(),
        log_format=LogFormat.CONSOLE,
        log_level=LogLevel.DEBUG,
        handler="tests.ops.log_handlers:logging_plain",
    )
    worker = await run(settings, broker, tmp_path / "consumer.log")

    output = worker.output()
    lines = output.splitlines()
    for event in ("stdlib debug line", "stdlib line from def handler", "structlog line"):
        written = [line for line in lines if event in line]
        assert len(written) == 3, (event, output)
        for key, attempt in (("k-ok", 1), ("k-retry", 1), ("k-retry", 2)):
            fields = (f"key={key}", f"attempt={attempt}", f"routing_key={ROUTING_KEY}")
            assert any(all(field in line for field in fields) for line in written), (key, output)
        assert all("message_id=m-" in line and "fence=" in line for line in written)
    assert NOISY_LINE not in output
    assert any(SUMMARY in line and "completed=2" in line for line in lines), output
