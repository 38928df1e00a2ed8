"""``semel dlq export`` and ``import``: a dead letter out as JSON Lines, edited, and back."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, FieldValue
from typer.testing import CliRunner

from semel.consumer import names
from semel.consumer.broker import topology
from semel.consumer.broker.header_codec import from_json_value
from semel.consumer.commands.app import app
from semel.consumer.names import Reason
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.conftest import SettingsFactory, settings_env
from tests.tools.conftest import dead_letter, letters, publish_letter, read, semel

pytestmark = pytest.mark.timeout(90)

# Producer headers a stream cannot hold as they are: they travel in x-semel-headers.
AWKWARD: dict[str, FieldValue] = {
    "table": {"tenant": "t-1", "nested": {"depth": 2}, "list": [1, "two"]},
    "array": [1, "two", {"three": 3}],
    "amount": Decimal("12.50"),
    "when": datetime(2026, 11, 27, 10, 0, 0, 123456, tzinfo=UTC),
    "raw": bytearray(b"\x00\xffbytes"),  # what a byte-array header reads as
    "flag": True,
}


@pytest.fixture
async def declared(connection: AbstractConnection, settings: Settings) -> None:
    await topology.declare(connection, topology_of(settings))


async def export(settings: Settings, *args: str) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "export", *args)
    assert done.code == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.mark.usefixtures("declared")
async def test_an_edited_export_imported_replaces_its_letter(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    old_id = await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    other = await dead_letter(channel, settings, "k-2", Reason.POISON)
    (line,) = await export(settings, "--key", "k-1")
    assert (line["letter_id"], line["key"], line["reason"]) == (old_id, "k-1", "max-attempts")
    assert line["exchange"] == settings.exchange
    assert (line["routing_key"], line["replays"], line["archived_at"]) == ("order.paid", 0, None)
    assert line["properties"]["message_id"] == "mid-k-1"
    body = json.loads(line["body"])
    assert body["amount"] == 1
    line["body"] = json.dumps(body | {"amount": 2})
    done = await semel(settings, "dlq", "import", write_lines(tmp_path / "edited.jsonl", [line]))
    assert done.code == 0, done.stderr
    assert "Imported 1 dead letter" in done.stdout

    state = await read(connection, settings)
    assert old_id not in state.letters
    assert other in state.letters
    (new,) = [letter for letter in state.live() if letter.letter_id != other]
    assert new.letter_id != old_id
    assert new.headers[names.H_EDITED_FROM] == old_id
    assert new.entry.key == "k-1"
    assert new.headers[names.H_KEY] == "k-1"
    assert json.loads(new.body)["amount"] == 2
    assert new.properties["message_id"] not in (None, "mid-k-1")
    assert new.properties["correlation_id"] == "corr-k-1"
    assert new.producer_headers()["Idempotency-Key"] == "k-1"
    assert new.entry.reason == "max-attempts"

    # The same file again: its letter is no longer there, so nothing is written.
    again = await semel(settings, "dlq", "import", str(tmp_path / "edited.jsonl"))
    assert again.code == 2
    assert "line 1" in again.stderr
    assert "nothing was imported" in again.stderr
    assert len(await letters(connection, settings)) == 2


async def test_the_message_id_is_kept_when_it_is_the_key(
    make_settings: SettingsFactory, settings: Settings, connection: AbstractConnection
) -> None:
    by_id = make_settings(
        amqp_url=settings.amqp_url,
        queue=settings.queue,
        exchange=settings.exchange,
        key_source="message_id",
    )
    await topology.declare(connection, topology_of(by_id))
    channel = await connection.channel(publisher_confirms=True)
    await dead_letter(channel, by_id, "k-1", Reason.MAX_ATTEMPTS)
    lines = await export(by_id)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["dlq", "import", "-"], input=text, env=settings_env(by_id)
    )
    assert result.exit_code == 0, result.stderr
    (new,) = await letters(connection, by_id)
    assert new.properties["message_id"] == "mid-k-1"
    assert new.headers[names.H_EDITED_FROM] == lines[0]["letter_id"]


@pytest.mark.usefixtures("declared")
async def test_awkward_headers_and_a_binary_body_round_trip_exactly(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
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
    )
    old_id = await publish_letter(channel, settings, message)
    (line,) = await export(settings)
    assert "body" not in line
    assert base64.b64decode(line["body_base64"]) == body
    assert {k: from_json_value(v) for k, v in line["headers"].items()} == AWKWARD
    assert line["headers"]["amount"] == {"$decimal": "12.50"}  # its exponent too
    output = tmp_path / "out.jsonl"
    done = await semel(settings, "dlq", "export", "--output", str(output))
    assert done.code == 0, done.stderr
    assert "Exported 1 dead letter" in done.stderr
    done = await semel(settings, "dlq", "import", str(output))
    assert done.code == 0, done.stderr
    (new,) = await letters(connection, settings)
    assert new.headers[names.H_EDITED_FROM] == old_id
    assert new.body == body
    assert new.producer_headers() == AWKWARD
    assert str(new.producer_headers()["amount"]) == "12.50"
    assert new.properties["timestamp"] == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert new.properties["priority"] == 3
    (again,) = await export(settings)
    assert again["headers"] == line["headers"]
    assert again["semel_headers"][names.H_KEY] == "k-bin"


BAD_LINES = [
    ("not json", "line 2"),
    (json.dumps({"body": "{}"}), "letter_id"),
    (json.dumps({"letter_id": "x", "body": "{}", "body_base64": "e30="}), "one of them"),
    (json.dumps({"letter_id": "x", "body": "{}", "headers": {"a": {"$decimal": "no"}}}), "line 2"),
    (json.dumps({"letter_id": "x", "body": "{}", "properties": {"colour": "red"}}), "colour"),
    (json.dumps({"letter_id": "x", "body_base64": "!!"}), "line 2"),
    (json.dumps({"letter_id": "x", "body": "{}", "semel_headers": {"plain": 1}}), "x-semel-"),
]


@pytest.mark.usefixtures("declared")
@pytest.mark.parametrize(("bad", "said"), BAD_LINES)
async def test_one_bad_line_refuses_the_whole_import(
    settings: Settings,
    connection: AbstractConnection,
    channel: AbstractChannel,
    tmp_path: Path,
    bad: str,
    said: str,
) -> None:
    first = await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    second = await dead_letter(channel, settings, "k-2", Reason.MAX_ATTEMPTS)
    lines = await export(settings)
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n" + bad + "\n" + json.dumps(lines[1]) + "\n")
    done = await semel(settings, "dlq", "import", str(path))
    assert done.code == 2
    assert done.stderr.count("\n") == 1
    assert "line 2" in done.stderr
    assert said in done.stderr
    state = await read(connection, settings)
    assert sorted(state.letters) == sorted([first, second])
    assert state.ended == 0
