"""``semel dlq discard``, ``archive``, ``unarchive`` and ``keep`` against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from semel.consumer import names
from semel.consumer.broker import topology
from semel.consumer.letters.log import STREAM_OFFSET
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.conftest import SettingsFactory, settings_env
from tests.tools.conftest import dead_letter, letters, read, semel, wait_for_letters

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def declared(connection: AbstractConnection, settings: Settings) -> None:
    await topology.declare(connection, topology_of(settings))


async def records(connection: AbstractConnection, settings: Settings) -> list[dict[str, Any]]:
    """Every record of the stream as ``{"headers", "body"}``, read up to an end record
    this appends (a stream cannot say how many it holds)."""
    stream = Topology(settings.queue).dead_letter_log
    end = uuid.uuid4().hex
    writer = await connection.channel(publisher_confirms=True)
    # A mark like a reading's: what a reader does not know as its own it passes by.
    mark = aio_pika.Message(json.dumps({"mark": end}).encode(), headers={names.H_DLQ_EVENT: "mark"})
    await writer.default_exchange.publish(mark, routing_key=stream)
    await writer.close()
    reader = await connection.channel()
    await reader.set_qos(prefetch_count=500)
    queue = await reader.declare_queue(stream, passive=True)
    found: list[dict[str, Any]] = []
    done = asyncio.get_running_loop().create_future()

    async def on_record(message: AbstractIncomingMessage) -> None:
        await message.ack()
        headers = dict(message.headers or {})
        headers.pop(STREAM_OFFSET, None)
        if message.body == json.dumps({"mark": end}).encode():
            if not done.done():
                done.set_result(None)
        elif not done.done():
            found.append({"headers": headers, "body": message.body})

    await queue.consume(on_record, arguments={STREAM_OFFSET: "first"})
    await asyncio.wait_for(done, 15)
    await reader.close()
    return found


def events(found: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [json.loads(r["body"]) for r in found if r["headers"].get(names.H_DLQ_EVENT) == kind]


async def keys(connection: AbstractConnection, settings: Settings) -> list[str]:
    return sorted(str(letter.entry.key) for letter in await letters(connection, settings))


async def archived_keys(connection: AbstractConnection, settings: Settings) -> list[str]:
    return sorted(str(letter.entry.key) for letter in (await read(connection, settings)).archived())


@pytest.mark.usefixtures("declared")
async def test_discard_needs_a_note_and_a_choice(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    no_note = await semel(settings, "dlq", "discard", "--all", "--yes")
    assert no_note.code == 2
    assert "--note" in no_note.stderr
    blank = await semel(settings, "dlq", "discard", "--all", "--yes", "--note", " ")
    assert blank.code == 2
    no_choice = await semel(settings, "dlq", "discard", "--yes", "--note", "why")
    assert (no_choice.code, no_choice.stderr.count("\n")) == (2, 1)
    assert "--all" in no_choice.stderr
    assert await keys(connection, settings) == ["k-1"]


@pytest.mark.usefixtures("declared")
async def test_discard_without_a_terminal_asks_for_yes_and_changes_nothing(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    done = await semel(settings, "dlq", "discard", "--all", "--note", "cleanup")
    assert done.code == 2
    assert done.stderr.count("\n") == 1
    assert "--yes" in done.stderr
    assert await keys(connection, settings) == ["k-1"]
    assert events(await records(connection, settings), "discarded") == []


@pytest.mark.usefixtures("declared")
async def test_discard_with_yes_ends_what_matches_and_records_note_and_who(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    ids = {
        key: await dead_letter(channel, settings, key, reason)
        for key, reason in [
            ("k-1", Reason.MAX_ATTEMPTS),
            ("k-2", Reason.MAX_ATTEMPTS),
            ("k-3", Reason.POISON),
        ]
    }
    done = await semel(
        settings,
        "dlq",
        "discard",
        "--reason",
        "max-attempts",
        "--note",
        "INC-42",
        "--yes",
        "--json",
    )
    assert done.code == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["matched"], counts["changed"], counts["live"]) == (2, 2, 1)
    assert await keys(connection, settings) == ["k-3"]
    (event,) = events(await records(connection, settings), "discarded")
    assert sorted(event["ids"]) == sorted([ids["k-1"], ids["k-2"]])
    assert event["note"] == "INC-42"
    user, _, host = event["by"].partition("@")
    assert user
    assert host
    # Nothing left to match: said so, exit 0.
    again = await semel(settings, "dlq", "discard", "--key", "k-1", "--note", "x", "--yes")
    assert again.code == 0, again.stderr
    assert "nothing discarded" in again.stdout


def _in_a_terminal(settings: Settings, answer: str, *args: str) -> tuple[int, str]:
    """Run ``semel`` with a terminal as its standard input, typing ``answer``."""
    main, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "semel.consumer.commands.app", *args],
            env=settings_env(settings),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        os.close(terminal)
        terminal = -1
        os.write(main, answer.encode() + b"\n")  # waits in the terminal until read
        out, _ = proc.communicate(timeout=60)
        return proc.returncode, out.decode()
    finally:
        os.close(main)
        if terminal >= 0:
            os.close(terminal)


@pytest.mark.usefixtures("declared")
async def test_discard_in_a_terminal_asks_first(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    for key in ("k-1", "k-2"):
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    args = ("dlq", "discard", "--all", "--note", "asked")
    code, out = await asyncio.to_thread(_in_a_terminal, settings, "n", *args)
    assert code == 1, out
    assert "Discard 2 dead letters?" in out
    assert await keys(connection, settings) == ["k-1", "k-2"]
    code, out = await asyncio.to_thread(_in_a_terminal, settings, "y", *args)
    assert code == 0, out
    assert "2 dead letters discarded" in out
    assert await keys(connection, settings) == []


@pytest.mark.usefixtures("declared")
async def test_archive_hides_unarchive_shows_and_archived_lists_them(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    ids = {key: await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS) for key in "abc"}
    done = await semel(settings, "dlq", "archive", "--key", "b", "--note", "later", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout)["changed"] == 1
    assert await keys(connection, settings) == ["a", "c"]
    assert await archived_keys(connection, settings) == ["b"]
    listed = await semel(settings, "dlq", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert sorted(row["key"] for row in json.loads(listed.stdout)["dead_letters"]) == ["a", "c"]
    shown = await semel(settings, "dlq", "list", "--archived", "--json")
    assert shown.code == 0, shown.stderr
    (row,) = json.loads(shown.stdout)["dead_letters"]
    assert (row["key"], row["letter_id"]) == ("b", ids["b"])
    assert row["archived_at"]
    # Archived letters are left alone by a discard of the live ones.
    gone = await semel(settings, "dlq", "discard", "--all", "--yes", "--note", "n", "--json")
    assert json.loads(gone.stdout)["changed"] == 2
    assert await archived_keys(connection, settings) == ["b"]
    back = await semel(settings, "dlq", "unarchive", "--all")
    assert back.code == 0, back.stderr
    assert await keys(connection, settings) == ["b"]
    assert await archived_keys(connection, settings) == []
    (archived,) = events(await records(connection, settings), "archived")
    assert (archived["ids"], archived["note"]) == ([ids["b"]], "later")


@pytest.mark.usefixtures("declared")
async def test_archive_and_unarchive_need_a_choice(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    for command in ("archive", "unarchive"):
        done = await semel(settings, "dlq", command)
        assert done.code == 2, command
    assert await keys(connection, settings) == ["k-1"]


async def test_an_archived_letter_ends_after_the_archive_retention(
    make_settings: SettingsFactory, settings: Settings, connection: AbstractConnection
) -> None:
    short = make_settings(
        amqp_url=settings.amqp_url,
        queue=settings.queue,
        exchange=settings.exchange,
        dlq_archive_retention=timedelta(seconds=1),
    )
    await topology.declare(connection, topology_of(short))
    channel = await connection.channel(publisher_confirms=True)
    for key in ("kept", "archived"):
        await dead_letter(channel, short, key, Reason.MAX_ATTEMPTS)
    done = await semel(short, "dlq", "archive", "--key", "archived")
    assert done.code == 0, done.stderr
    end = time.monotonic() + 15
    while (await read(connection, short)).archived():
        assert time.monotonic() < end, "the archived letter outlived its retention"
        await asyncio.sleep(0.2)
    state = await read(connection, short)
    assert [letter.entry.key for letter in state.live()] == ["kept"]
    assert state.ended == 1
    # Gone for good: unarchive finds nothing.
    back = await semel(short, "dlq", "unarchive", "--all", "--json")
    assert json.loads(back.stdout)["changed"] == 0


@pytest.mark.usefixtures("declared")
async def test_keep_carries_a_week_old_letter_forward_and_it_stays_listed_once(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    # Its only copy says it was written 8 days ago (the stream's max age is 28).
    old = await dead_letter(channel, settings, "old", Reason.MAX_ATTEMPTS, age=timedelta(days=8))
    new = await dead_letter(channel, settings, "new", Reason.MAX_ATTEMPTS)
    done = await semel(settings, "dlq", "keep", "--json")
    assert done.code == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["carried"], counts["live"], counts["archived"]) == (1, 2, 0)
    found = await records(connection, settings)
    copies = [r["headers"] for r in found if r["headers"].get(names.H_LETTER_ID) == old]
    assert len(copies) == 2
    assert names.H_CARRIED_AT not in copies[0]
    carried_at = datetime.fromisoformat(str(copies[1][names.H_CARRIED_AT]))
    assert datetime.now(UTC) - carried_at < timedelta(minutes=1)
    assert copies[1][names.H_KEY] == "old"
    assert [r for r in found if r["headers"].get(names.H_LETTER_ID) == new] != []
    listed = await wait_for_letters(connection, settings, 2)
    assert sorted(str(letter.entry.key) for letter in listed) == ["new", "old"]
    # The copy is new now: a second keep copies nothing.
    again = await semel(settings, "dlq", "keep")
    assert again.code == 0, again.stderr
    assert "0 copied forward" in again.stdout
