"""``semel dlq discard``, ``archive``, ``unarchive`` and ``audit`` against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel

from semel.consumer.broker import letter_manage
from semel.consumer.names import Reason, Topology
from semel.settings import Settings, derived
from tests.conftest import settings_env
from tests.tools.conftest import dead_letter, depth, eventually, semel, wait_for_depth

pytestmark = pytest.mark.timeout(90)


async def listed(settings: Settings, *args: str) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "list", "--json", "--limit", "1000", *args)
    assert done.code == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["dead_letters"]
    return rows


async def keys(settings: Settings, *args: str) -> list[str]:
    return sorted(str(row["key"]) for row in await listed(settings, *args))


async def ids_of(settings: Settings, *wanted: str) -> list[str]:
    """The letter ids of these keys (a listing's turn gives every letter one)."""
    rows = await listed(settings, "--archived")
    return sorted(row["letter_id"] for row in rows if row["key"] in wanted)


async def audit(settings: Settings) -> list[dict[str, Any]]:
    done = await semel(settings, "dlq", "audit", "--json")
    assert done.code == 0, done.stderr
    records: list[dict[str, Any]] = json.loads(done.stdout)["records"]
    return records


async def letters(channel: AbstractChannel, settings: Settings, *keyed: tuple[str, Reason]) -> None:
    for key, reason in keyed:
        await dead_letter(channel, settings, key, reason)
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, len(keyed))


@pytest.mark.usefixtures("declared")
async def test_discard_needs_a_choice_and_without_a_terminal_a_yes(
    settings: Settings, channel: AbstractChannel
) -> None:
    await letters(channel, settings, ("k-1", Reason.MAX_ATTEMPTS))
    no_choice = await semel(settings, "dlq", "discard", "--yes")
    assert (no_choice.code, no_choice.stderr.count("\n")) == (2, 1)
    assert "--all" in no_choice.stderr
    # The test runner's standard input is no terminal: nothing to ask, so no discard.
    no_terminal = await semel(settings, "dlq", "discard", "--all", "--note", "cleanup")
    assert (no_terminal.code, no_terminal.stderr.count("\n")) == (2, 1)
    assert "--yes" in no_terminal.stderr
    assert await keys(settings) == ["k-1"]
    assert await audit(settings) == []


@pytest.mark.usefixtures("declared")
async def test_discard_with_yes_removes_what_matches_and_records_it(
    settings: Settings, channel: AbstractChannel
) -> None:
    await letters(
        channel,
        settings,
        ("k-1", Reason.MAX_ATTEMPTS),
        ("k-2", Reason.MAX_ATTEMPTS),
        ("k-3", Reason.POISON),
    )
    chosen = await ids_of(settings, "k-1", "k-2")
    args = ("--reason", "max-attempts", "--note", "INC-42", "--yes", "--json")
    done = await semel(settings, "dlq", "discard", *args)
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout)["discarded"] == 2
    assert await keys(settings) == ["k-3"]
    (record,) = await audit(settings)
    assert (record["op"], record["count"], record["note"]) == ("discard", 2, "INC-42")
    assert sorted(record["ids"]) == chosen
    assert record["filters"] == {"reasons": ["max-attempts"], "yes": True}
    user, _, host = record["by"].partition("@")
    assert user
    assert host
    assert (record["part"], record["parts"]) == (1, 1)
    # Nothing left to match: said so, exit 0, and recorded too.
    again = await semel(settings, "dlq", "discard", "--key", "k-1", "--yes")
    assert again.code == 0, again.stderr
    assert "nothing discarded" in again.stdout
    newest, _ = await audit(settings)
    assert (newest["count"], newest["ids"], newest["filters"]) == (
        0,
        [],
        {"key": "k-1", "yes": True},
    )


def _read(fd: int, until: bytes | None, deadline: float) -> bytes:
    """What the terminal shows, up to ``until`` (``None``: until the program ends)."""
    out = b""
    while until is None or until not in out:
        if time.monotonic() > deadline:
            raise AssertionError(f"the terminal showed {out!r}, not {until!r}")
        if not select.select([fd], [], [], 0.2)[0]:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the program ended: Linux answers EIO
            chunk = b""
        if not chunk:
            if until is None:
                return out
            raise AssertionError(f"the program ended having shown {out!r}")
        out += chunk
    return out


async def in_a_terminal(
    settings: Settings, answer: str, meanwhile: Callable[[], Awaitable[None]], *args: str
) -> tuple[int, str]:
    """Run ``semel`` in a terminal; once it asks, run ``meanwhile``, then type ``answer``."""
    main, terminal = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "semel.consumer.commands.app", *args),
        env=settings_env(settings),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    try:
        deadline = time.monotonic() + 60
        out = await asyncio.to_thread(_read, main, b"[y/N]", deadline)
        await meanwhile()
        os.write(main, answer.encode() + b"\n")
        out += await asyncio.to_thread(_read, main, None, deadline)
        return await asyncio.wait_for(proc.wait(), 30), out.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(main)


@pytest.mark.usefixtures("declared")
async def test_discard_in_a_terminal_asks_first_and_takes_only_what_it_counted(
    settings: Settings, channel: AbstractChannel
) -> None:
    await letters(channel, settings, ("k-1", Reason.MAX_ATTEMPTS), ("k-2", Reason.MAX_ATTEMPTS))
    args = ("dlq", "discard", "--all", "--note", "asked")

    async def nothing() -> None:
        pass

    code, out = await in_a_terminal(settings, "n", nothing, *args)
    assert code == 1, out
    assert "Discard 2 dead letters?" in out
    assert "Nothing discarded" in out
    assert await keys(settings) == ["k-1", "k-2"]
    assert await audit(settings) == []

    async def another_arrives() -> None:  # after the count, before the answer
        await dead_letter(channel, settings, "k-late", Reason.MAX_ATTEMPTS)

    code, out = await in_a_terminal(settings, "y", another_arrives, *args)
    assert code == 0, out
    assert "Discard 2 dead letters?" in out
    assert "2 dead letters discarded" in out
    assert await keys(settings) == ["k-late"]
    (record,) = await audit(settings)
    assert (record["op"], record["count"], record["note"]) == ("discard", 2, "asked")


@pytest.mark.usefixtures("declared")
async def test_archive_hides_archived_shows_and_unarchive_brings_back(
    settings: Settings, channel: AbstractChannel
) -> None:
    await letters(
        channel,
        settings,
        ("a", Reason.MAX_ATTEMPTS),
        ("b", Reason.MAX_ATTEMPTS),
        ("c", Reason.POISON),
    )
    (b_id,) = await ids_of(settings, "b")
    done = await semel(settings, "dlq", "archive", "--key", "b", "--note", "later", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout)["archived"] == 1
    assert await keys(settings) == ["a", "c"]
    (row,) = [row for row in await listed(settings, "--archived") if row["key"] == "b"]
    assert (row["letter_id"], row["archived_at"] is not None) == (b_id, True)
    # Hidden from a discard of everything live, and from an export.
    gone = await semel(settings, "dlq", "discard", "--all", "--yes", "--json")
    assert json.loads(gone.stdout)["discarded"] == 2
    exported = await semel(settings, "dlq", "export")
    assert (exported.code, exported.stdout) == (0, ""), exported.stderr
    assert await keys(settings, "--archived") == ["b"]

    back = await semel(settings, "dlq", "unarchive", "--all")
    assert back.code == 0, back.stderr
    assert "1 dead letter unarchived" in back.stdout
    (row,) = await listed(settings)
    assert (row["key"], row["letter_id"], row["archived_at"]) == ("b", b_id, None)
    unarchived, discarded, archived = await audit(settings)
    assert (archived["op"], archived["ids"], archived["note"]) == ("archive", [b_id], "later")
    assert archived["filters"] == {"key": "b"}
    assert (discarded["op"], discarded["count"]) == ("discard", 2)
    assert (unarchived["op"], unarchived["ids"], unarchived["filters"]) == (
        "unarchive",
        [b_id],
        {"all": True},
    )


@pytest.mark.usefixtures("declared")
async def test_archive_and_unarchive_need_a_choice(
    settings: Settings, channel: AbstractChannel
) -> None:
    await letters(channel, settings, ("k-1", Reason.MAX_ATTEMPTS))
    for command in ("archive", "unarchive"):
        done = await semel(settings, "dlq", command)
        assert (done.code, done.stderr.count("\n")) == (2, 1), command
    assert await keys(settings) == ["k-1"]


def short_retention(settings: Settings, seconds: float) -> Settings:
    return derived(settings, dlq_archive_retention=timedelta(seconds=seconds))


@pytest.mark.usefixtures("declared")
async def test_an_archived_letter_at_the_head_leaves_by_the_brokers_ttl_alone(
    settings: Settings, channel: AbstractChannel
) -> None:
    short = short_retention(settings, 2)
    await letters(channel, short, ("archived", Reason.MAX_ATTEMPTS), ("kept", Reason.POISON))
    started = time.monotonic()  # its copy, and its expiration, come after this
    done = await semel(short, "dlq", "archive", "--key", "archived")
    assert done.code == 0, done.stderr
    dlq_name = Topology(settings.queue).dead_letter_queue

    async def gone() -> bool:  # no command runs meanwhile: only the broker
        return await depth(channel, dlq_name) == 1

    await eventually(gone, deadline=15)
    assert time.monotonic() - started > 1.9, "gone before its retention"
    assert await keys(short, "--archived") == ["kept"]


@pytest.mark.usefixtures("declared")
async def test_an_archived_letter_behind_another_leaves_at_the_next_turn_and_the_other_stays(
    settings: Settings, channel: AbstractChannel
) -> None:
    """Not at the head, the broker drops it when a turn reaches it, and delivers the
    turn's first copy in its place: that copy must be kept, not taken for a double."""
    short = short_retention(settings, 1)
    await letters(channel, short, ("kept", Reason.POISON), ("archived", Reason.MAX_ATTEMPTS))
    done = await semel(short, "dlq", "archive", "--key", "archived")
    assert done.code == 0, done.stderr
    dlq_name = Topology(settings.queue).dead_letter_queue
    # Time passing is the point: no event says the retention has run out.
    await asyncio.sleep(1.5)
    # Not at the head, so the broker has not dropped it.
    assert await depth(channel, dlq_name) == 2
    assert await keys(short, "--archived") == ["kept"]
    await wait_for_depth(channel, dlq_name, 1)
    assert await keys(short, "--archived") == ["kept"]


@pytest.mark.usefixtures("declared")
async def test_a_turn_drops_a_letter_archived_longer_ago_than_the_retention(
    settings: Settings, channel: AbstractChannel
) -> None:
    """Archived under a long retention, then the retention shortened: its copy still
    carries the long expiration, so the next turn is what removes it."""
    await letters(channel, settings, ("kept", Reason.POISON), ("archived", Reason.MAX_ATTEMPTS))
    done = await semel(settings, "dlq", "archive", "--key", "archived")
    assert done.code == 0, done.stderr
    await asyncio.sleep(1.2)  # archived longer ago than the shortened retention
    short = short_retention(settings, 1)
    exported = await semel(short, "dlq", "export", "--archived")
    assert exported.code == 0, exported.stderr
    assert [json.loads(line)["key"] for line in exported.stdout.splitlines()] == ["kept"]
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 1)
    assert await keys(settings, "--archived") == ["kept"]


async def test_a_bad_archive_retention_stops_the_command_with_one_line(
    settings: Settings,
) -> None:
    env = settings_env(settings) | {"SEMEL_DLQ_ARCHIVE_RETENTION": "soon"}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "semel.consumer.commands.app", "dlq", "archive", "--all"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().count("\n") == 1
    assert "SEMEL_DLQ_ARCHIVE_RETENTION" in err.decode()
    assert out == b""


@pytest.mark.usefixtures("declared")
async def test_a_change_of_many_letters_is_recorded_in_parts_and_audit_shows_the_newest(
    settings: Settings, channel: AbstractChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = [(f"k-{n}", Reason.MAX_ATTEMPTS) for n in range(5)]
    await letters(channel, settings, *keyed)
    every = await ids_of(settings, *(key for key, _ in keyed))
    monkeypatch.setattr(letter_manage, "IDS_PER_RECORD", 2)  # the commands run in-process
    done = await semel(settings, "dlq", "archive", "--all", "--note", "batch")
    assert done.code == 0, done.stderr
    parts = list(reversed(await audit(settings)))
    assert [(r["part"], r["parts"], r["count"], len(r["ids"])) for r in parts] == [
        (1, 3, 5, 2),
        (2, 3, 5, 2),
        (3, 3, 5, 1),
    ]
    assert len({r["run"] for r in parts}) == 1
    assert sorted(i for r in parts for i in r["ids"]) == every
    newest = await semel(settings, "dlq", "audit", "--limit", "2", "--json")
    assert [r["part"] for r in json.loads(newest.stdout)["records"]] == [3, 2]
    shown = await semel(settings, "dlq", "audit", "--limit", "2")
    assert shown.code == 0, shown.stderr
    assert "2 audit records shown" in shown.stdout
    assert shown.stdout.count("archive") == 2
