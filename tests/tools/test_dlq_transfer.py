"""``semel dlq export`` and ``import``: dead letters out as JSON Lines, edited, and back in."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, FieldValue

from semel.consumer import names
from semel.consumer.broker import topology
from semel.consumer.broker.header_codec import from_json_value, parse_import
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings, derived
from tests.conftest import SettingsFactory
from tests.consumer.conftest import FAST
from tests.consumer.handlers import LEDGER_ENV, read_ledger
from tests.consumer.harness import Broker, InProcessConsumer
from tests.tools.conftest import dead_letter, eventually, semel, wait_for_depth

pytestmark = pytest.mark.timeout(90)

# Header values of every AMQP type a producer may send (timestamps in whole
# seconds: that is all AMQP keeps).
AWKWARD: dict[str, FieldValue] = {
    "table": {"tenant": "t-1", "nested": {"depth": 2}, "list": [1, "two"]},
    "array": [1, "two", {"three": 3}],
    "amount": Decimal("12.50"),
    "when": datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC),
    "raw": bytearray(b"\x00\xffbytes"),
    "flag": True,
    "ratio": 0.25,
}


@pytest.fixture
def settings(make_settings: SettingsFactory, rabbitmq_server: str) -> Settings:
    """A consumer's settings (the consumer tests' fast ones) on a private topology."""
    run = uuid.uuid4().hex[:10]
    private = {"amqp_url": rabbitmq_server, "queue": f"t.tools.{run}", "exchange": f"t.{run}.ev"}
    return make_settings(**(FAST | private))


async def export(settings: Settings, *args: str) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "export", *args)
    assert done.code == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


async def audit(settings: Settings) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "audit", "--json")
    assert done.code == 0, done.stderr
    records: list[dict[str, Any]] = json.loads(done.stdout)["records"]
    return records


@pytest.mark.usefixtures("declared")
async def test_an_edited_export_imported_and_replayed_runs_the_edited_body_once(
    settings: Settings,
    connection: AbstractConnection,
    channel: AbstractChannel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body the producer cut short, fixed by hand: the key never ran, so the fixed
    body is its first (a key that ran keeps its body's fingerprint in the store,
    and a replay of another body is a payload mismatch)."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    dlq_name = Topology(settings.queue).dead_letter_queue
    await dead_letter(channel, settings, "other", Reason.POISON)
    broker = Broker(connection, channel)
    consumer = await InProcessConsumer(settings).start(broker, settings)
    try:
        await broker.publish(settings, b'{"order_id": "k-1", "amou', key="k-1", message_id="m-1")
        await wait_for_depth(channel, dlq_name, 2)

        (line,) = await export(settings, "--key", "k-1")
        assert (line["key"], line["reason"]) == ("k-1", Reason.MALFORMED_BODY.value)
        assert (line["exchange"], line["replays"], line["archived_at"]) == (
            settings.exchange,
            0,
            None,
        )
        assert line["properties"]["message_id"] == "m-1"
        assert line["headers"] == {"Idempotency-Key": "k-1"}
        assert line["semel_headers"][names.H_KEY] == "k-1"
        assert line["body"] == '{"order_id": "k-1", "amou'
        old_id = line["letter_id"]
        line["body"] = json.dumps({"order_id": "k-1", "amount": 2})
        path = write_lines(tmp_path / "edited.jsonl", [line])
        done = await semel(settings, "dlq", "import", path, "--note", "completed the body")
        assert done.code == 0, done.stderr
        assert "Imported 1 dead letter" in done.stdout

        (new,) = await export(settings, "--key", "k-1")
        assert new["letter_id"] != old_id
        assert new["semel_headers"][names.H_EDITED_FROM] == old_id
        assert new["properties"]["message_id"] not in (None, "m-1")
        assert (new["key"], new["reason"], new["headers"]) == (
            "k-1",
            Reason.MALFORMED_BODY.value,
            {"Idempotency-Key": "k-1"},
        )
        assert json.loads(new["body"]) == {"order_id": "k-1", "amount": 2}
        # The same file again finds its work done: nothing doubled.
        again = await semel(settings, "dlq", "import", path, "--json")
        assert again.code == 0, again.stderr
        assert json.loads(again.stdout) == {
            "imported": 1,
            "published": 0,
            "resumed": 1,
            "replaced": 0,
        }
        assert [row["letter_id"] for row in await export(settings, "--key", "k-1")] == [
            new["letter_id"]
        ]

        replayed = await semel(settings, "dlq", "replay", "--key", "k-1")
        assert replayed.code == 0, replayed.stderr

        def runs() -> list[str]:
            return [run["event"] for run in read_ledger(ledger) if run["key"] == "k-1"]

        async def ran() -> bool:
            return "end" in runs()

        await eventually(ran, deadline=30)
        await wait_for_depth(channel, dlq_name, 1)  # "other" alone
        await nothing_waiting(broker, settings)
    finally:
        assert await consumer.finish() == 0
    assert runs() == ["start", "end"]
    second, first = await audit(settings)
    assert (first["op"], first["note"], first["ids"]) == ("import", "completed the body", [old_id])
    assert first["new_ids"] == [new["letter_id"]]
    assert (first["published"], first["replaced"], first["filters"]) == (1, 1, {"file": path})
    assert (second["published"], second["resumed"], second["replaced"]) == (0, 1, 0)


async def nothing_waiting(broker: Broker, settings: Settings) -> None:
    """Every copy settled: nothing waits in the work queue or its delay queues."""
    for spec in topology.queue_specs(topology_of(settings)):
        if spec.name != Topology(settings.queue).dead_letter_queue:
            assert await broker.depth(spec.name) == 0, spec.name


@pytest.mark.usefixtures("declared")
async def test_an_import_killed_after_publishing_finishes_on_the_next_run_without_a_double(
    settings: Settings, channel: AbstractChannel, tmp_path: Path
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "k-2", Reason.MAX_ATTEMPTS)
    lines = await export(settings)
    for line in lines:
        line["body"] = json.dumps({"order_id": line["key"], "amount": 3})
    path = write_lines(tmp_path / "edited.jsonl", lines)
    # What a kill between the two steps leaves: k-1's new letter published, the old one there.
    edits = parse_import([json.dumps(line) for line in lines])
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    await dlx.publish(edits[0].message(keep_message_id=False), names.DLQ_ROUTING_KEY)
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 3)

    done = await semel(settings, "dlq", "import", path, "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {"imported": 2, "published": 1, "resumed": 1, "replaced": 2}
    after = await export(settings)
    assert sorted(row["letter_id"] for row in after) == sorted(e.letter_id for e in edits)
    assert sorted(row["key"] for row in after) == ["k-1", "k-2"]
    assert {json.loads(row["body"])["amount"] for row in after} == {3}


async def test_the_message_id_is_kept_when_it_is_the_key(
    settings: Settings, connection: AbstractConnection, tmp_path: Path
) -> None:
    by_id = derived(settings, key_source="message_id")
    await topology.declare(connection, topology_of(by_id))
    try:
        channel = await connection.channel(publisher_confirms=True)
        await dead_letter(channel, by_id, "k-1", Reason.MAX_ATTEMPTS)
        lines = await export(by_id)
        done = await semel(by_id, "dlq", "import", write_lines(tmp_path / "x.jsonl", lines))
        assert done.code == 0, done.stderr
        (new,) = await export(by_id)
        assert new["properties"]["message_id"] == "mid-k-1"
        assert new["semel_headers"][names.H_EDITED_FROM] == lines[0]["letter_id"]
    finally:
        cleanup = await connection.channel()
        await cleanup.queue_delete(Topology(settings.queue).dead_letter_queue + ".audit")


@pytest.mark.usefixtures("declared")
async def test_every_header_type_and_a_binary_body_round_trip_exactly(
    settings: Settings, channel: AbstractChannel, tmp_path: Path
) -> None:
    body = b"\x00\x01\xfe\xff not utf-8"
    message = aio_pika.Message(
        body,
        headers=AWKWARD
        | {
            names.H_REASON: Reason.INVALID_BODY.value,
            names.H_KEY: "k-bin",
            names.H_DEAD_LETTERED_AT: datetime.now(UTC).isoformat(),
        },
        message_id="mid-bin",
        timestamp=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        priority=3,
        content_type="application/octet-stream",
    )
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    await dlx.publish(message, names.DLQ_ROUTING_KEY)
    output = tmp_path / "out.jsonl"
    done = await semel(settings, "dlq", "export", "--output", str(output))
    assert done.code == 0, done.stderr
    assert "Exported 1 dead letter" in done.stderr
    assert not (tmp_path / "out.jsonl.part").exists()
    (line,) = [json.loads(text) for text in output.read_text().splitlines()]
    assert "body" not in line
    assert base64.b64decode(line["body_base64"]) == body
    assert {k: from_json_value(v) for k, v in line["headers"].items()} == AWKWARD
    assert line["headers"]["amount"] == {"$decimal": "12.50"}  # its exponent too
    assert line["properties"]["timestamp"] == "2026-01-02T03:04:05+00:00"

    done = await semel(settings, "dlq", "import", str(output))
    assert done.code == 0, done.stderr
    (again,) = await export(settings)
    assert again["semel_headers"][names.H_EDITED_FROM] == line["letter_id"]
    assert again["body_base64"] == line["body_base64"]
    assert again["headers"] == line["headers"]
    for kept in ("timestamp", "priority", "content_type"):
        assert again["properties"][kept] == line["properties"][kept], kept
    assert again["properties"]["message_id"] != "mid-bin"


@pytest.mark.usefixtures("declared")
async def test_one_invalid_line_imports_nothing(
    settings: Settings, channel: AbstractChannel, tmp_path: Path
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "k-2", Reason.MAX_ATTEMPTS)
    lines = await export(settings)
    bad = json.dumps(lines[1] | {"headers": {"amount": {"$decimal": "lots"}}})
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n" + bad + "\n")
    done = await semel(settings, "dlq", "import", str(path))
    assert (done.code, done.stderr.count("\n")) == (2, 1)
    assert "line 2" in done.stderr
    assert "nothing was imported" in done.stderr
    assert await export(settings) == lines
    assert await audit(settings) == []


@pytest.mark.usefixtures("declared")
async def test_an_import_of_a_letter_no_longer_there_is_refused_whole(
    settings: Settings, channel: AbstractChannel, tmp_path: Path
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "k-2", Reason.MAX_ATTEMPTS)
    lines = await export(settings)
    gone = await semel(settings, "dlq", "discard", "--key", "k-2", "--yes")
    assert gone.code == 0, gone.stderr
    done = await semel(settings, "dlq", "import", write_lines(tmp_path / "x.jsonl", lines))
    assert (done.code, done.stderr.count("\n")) == (2, 1)
    assert "line 2" in done.stderr
    assert lines[1]["letter_id"] in done.stderr
    assert await export(settings) == lines[:1]


@pytest.mark.usefixtures("declared")
async def test_an_edited_body_of_a_key_that_ran_and_failed_runs_once_when_replayed(
    settings: Settings,
    connection: AbstractConnection,
    channel: AbstractChannel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler ran and refused the body for good: the key's failed record holds that
    body's fingerprint. The edited body, imported and replayed, runs under the key
    (a reset to the edited body's fingerprint), not dead-lettered as a mismatch."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    dlq_name = Topology(settings.queue).dead_letter_queue
    broker = Broker(connection, channel)
    consumer = await InProcessConsumer(settings).start(broker, settings)

    def runs() -> list[str]:
        return [run["event"] for run in read_ledger(ledger) if run["key"] == "k-2"]

    try:
        body = json.dumps({"order_id": "k-2", "permanent": "amount -1 refused"}).encode()
        await broker.publish(settings, body, key="k-2", message_id="m-2")
        await wait_for_depth(channel, dlq_name, 1)
        (line,) = await export(settings, "--key", "k-2")
        assert line["reason"] == Reason.PERMANENT_ERROR.value
        line["body"] = json.dumps({"order_id": "k-2", "amount": 1})
        done = await semel(settings, "dlq", "import", write_lines(tmp_path / "e.jsonl", [line]))
        assert done.code == 0, done.stderr

        replayed = await semel(settings, "dlq", "replay", "--key", "k-2", "--json")
        assert replayed.code == 0, replayed.stderr
        assert json.loads(replayed.stdout)["reset"] == 1

        async def ran() -> bool:
            return "end" in runs()

        await eventually(ran, deadline=30)
        await nothing_waiting(broker, settings)
        assert await broker.depth(dlq_name) == 0
    finally:
        assert await consumer.finish() == 0
    assert runs() == ["start", "start", "end"]
