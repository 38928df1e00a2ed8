"""The outbox watch: gauges and the /readyz detail from a real outbox table, and its log."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import orjson
import pytest
import structlog

from semel.consumer.ops.health import Health
from semel.consumer.ops.httpd import open_operations
from semel.consumer.ops.metered import MeteredStore
from semel.consumer.ops.metrics import Metrics
from semel.consumer.ops.outbox_watch import OK, Look, OutboxWatch
from semel.stores.postgres.outbox_status import connecting, summary_reader
from tests.ops.conftest import http, scrape
from tests.ops.fakes import ScriptedStore, StubConnection, connection
from tests.outbox_ops.conftest import Rows
from tests.servers import free_port

pytestmark = pytest.mark.timeout(30)

STALE_AFTER = 60.0


@contextlib.asynccontextmanager
async def ready_endpoint(port: int, metrics: Metrics) -> AsyncIterator[Health]:
    """The operations endpoint of a process whose broker and store are up."""
    async with contextlib.asynccontextmanager(open_operations)(port, metrics) as health:
        broker = StubConnection()
        broker.connected.set()
        health.watch_broker(connection(broker))
        health.watch_store(MeteredStore(ScriptedStore(), metrics))
        yield health


async def test_a_stale_message_shows_in_the_gauges_and_readyz_which_stays_200(
    outbox: Rows, postgres_server: str
) -> None:
    port, metrics = free_port(), Metrics()
    look = summary_reader(connecting(postgres_server), outbox.table, STALE_AFTER)
    async with ready_endpoint(port, metrics) as health:
        watch = OutboxWatch(look, metrics.outbox_gauges())  # as beside a relay
        health.watch_outbox(watch.detail)

        async def readyz() -> tuple[int, dict[str, str]]:
            answer = await http(port, "/readyz")
            return answer.status, orjson.loads(answer.body)

        assert (await readyz())[1]["outbox"] == "unknown: not read yet"
        await watch(object())  # what the relay does every few seconds
        assert (await readyz())[1]["outbox"] == OK
        samples = await scrape(port)
        assert samples.get("semel_outbox_unsent") == 0
        assert samples.get("semel_outbox_oldest_unsent_seconds") == 0

        fresh = await outbox.add(key="order-1", age=5)
        await outbox.add(key="order-0", age=900, sent=True)  # sent: never stale
        await watch()
        assert (await readyz())[1]["outbox"] == OK  # 5 s old: not stale yet
        assert (await scrape(port)).get("semel_outbox_unsent") == 1

        await outbox.age(fresh, 150)  # staged 2m30s ago: the relay is stuck
        refused = await outbox.add(
            key="order-2", age=70, attempts=2, retry_in=30,
            last_error="unroutable: no queue is bound for its routing key",
        )  # fmt: skip
        await watch()
        status, body = await readyz()
        assert status == 200, body  # seen, but still ready
        assert body["status"] == "ready"
        assert re.fullmatch(
            r"2 of 2 unsent messages waiting longer than 1m00s, the oldest 2m3\ds; "
            r"1 refused by the broker \(1 unroutable\); see `semel outbox list`",
            body["outbox"],
        ), body
        samples = await scrape(port)
        assert samples.get("semel_outbox_unsent") == 2
        assert 150 <= samples.get("semel_outbox_oldest_unsent_seconds") < 160

        await outbox.send(fresh)
        await outbox.age(refused, 10)  # what is left is recent again
        await watch()
        assert (await readyz()) == (200, body | {"outbox": OK})
        assert (await scrape(port)).get("semel_outbox_unsent") == 1


async def test_without_a_relay_there_is_no_outbox_detail_and_no_outbox_gauge() -> None:
    port, metrics = free_port(), Metrics()
    async with ready_endpoint(port, metrics):
        answer = await http(port, "/readyz")
        assert answer.status == 200
        assert "outbox" not in orjson.loads(answer.body)
        scraped = (await http(port, "/metrics")).body
        assert b"semel_outbox" not in scraped


@dataclass(frozen=True)
class Counts:
    unsent: int = 1
    refused: int = 0
    unroutable: int = 0
    stale: int = 0
    stale_after: float = STALE_AFTER
    oldest_age: float | None = 5.0


class Scripted:
    """Answers each look with the next of ``answers`` (an exception is raised)."""

    def __init__(self, *answers: Counts | Exception) -> None:
        self.answers = list(answers)

    async def __call__(self) -> Counts:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_a_warning_once_per_episode_of_stale_messages_and_of_failed_looks() -> None:
    stale = Counts(unsent=3, stale=2, oldest_age=400.0)
    script = Scripted(
        Counts(), stale, stale, replace(stale, stale=3), Counts(),
        stale, OSError("connection refused"), OSError("connection refused"), Counts(),
    )  # fmt: skip
    look: Look = script
    watch = OutboxWatch(look, Metrics().outbox_gauges())
    details = []
    with structlog.testing.capture_logs() as logs:
        while script.answers:
            await watch.look()
            details.append(watch.detail())
    events = [(entry["log_level"], entry["event"]) for entry in logs]
    assert events == [
        ("warning", "outbox messages unsent too long"),
        ("info", "outbox caught up"),
        ("warning", "outbox messages unsent too long"),
        ("warning", "outbox not read"),
        ("info", "outbox read again"),
        ("info", "outbox caught up"),
    ]
    assert details[0] == OK
    assert details[1].startswith("2 of 3 unsent messages waiting longer than 1m00s, the oldest")
    assert "none refused: is a relay running, and reaching the broker?" in details[1]
    assert details[6] == "unknown: the outbox could not be read (connection refused)"
    assert details[-1] == OK
