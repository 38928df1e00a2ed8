"""``semel outbox list`` against a real outbox table: counts, why each message waits, JSON."""

from __future__ import annotations

import orjson
import pytest

from semel.settings import Settings
from semel.stores.postgres.outbox import MISSING_TABLE
from tests.outbox_ops.conftest import BODY_MARKER, Rows, semel

pytestmark = pytest.mark.timeout(60)

UNROUTABLE = "unroutable: no queue is bound for its routing key"
NACKED = "refused by the broker (basic.nack)"
NOT_FOUND = "exchange not found: NOT_FOUND - no exchange 'shop.v2' in vhost '/'"


def in_mode(settings: Settings, transactional: bool) -> Settings:
    """The settings, in transactional mode or not (which runs handlers on 32 connections)."""
    if not transactional:
        return settings
    return Settings(**(settings.model_dump() | {"transactional": True, "prefetch": 16}))


async def _fill(outbox: Rows) -> dict[str, int]:
    """One row of each kind, and sent ones that must not show."""
    await outbox.add(key="sent-long-ago", age=900, sent=True)
    rows = {
        "due": await outbox.add(key="order-1", age=300),
        "unroutable": await outbox.add(
            key="order-2", routing_key="order.refunded", age=90, attempts=3,
            last_error=UNROUTABLE, retry_in=120,
        ),
        "nacked": await outbox.add(
            key="order-3", age=5, attempts=1, last_error=NACKED, retry_in=30,
        ),
        "missing": await outbox.add(
            key="order-4", exchange="shop.v2", age=70, attempts=2, last_error=NOT_FOUND,
            retry_in=45,
        ),
    }  # fmt: skip
    await outbox.add(key="sent-just-now", sent=True)
    return rows


@pytest.mark.parametrize("transactional", [False, True])
async def test_json_gives_the_counts_then_each_message_and_why(
    outbox: Rows, settings: Settings, transactional: bool
) -> None:
    rows = await _fill(outbox)
    settings = in_mode(settings, transactional)
    listed = await semel(settings, "outbox", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert BODY_MARKER not in listed.stdout
    answer = orjson.loads(listed.stdout)
    assert answer["table"] == outbox.table
    counts = answer["counts"]
    assert {k: counts[k] for k in ("unsent", "due", "backing_off", "refused", "unroutable")} == {
        "unsent": 4, "due": 1, "backing_off": 3, "refused": 3, "unroutable": 1,
    }  # fmt: skip
    assert (counts["stale"], counts["stale_after_seconds"]) == (3, 60.0)
    assert 299 <= counts["oldest_age_seconds"] <= 330
    waiting = {m["id"]: m for m in answer["waiting"]}
    assert list(waiting) == [rows["due"], rows["unroutable"], rows["nacked"], rows["missing"]]
    why = {name: (waiting[i]["why"], waiting[i]["refusal"]) for name, i in rows.items()}
    assert why == {
        "due": ("waiting", None),
        "unroutable": ("back-off", "unroutable"),
        "nacked": ("back-off", "nacked"),
        "missing": ("back-off", "exchange not found"),
    }
    unroutable = waiting[rows["unroutable"]]
    assert unroutable["key"] == "order-2"
    assert unroutable["routing_key"] == "order.refunded"
    assert unroutable["exchange"] == "shop"
    assert unroutable["attempts"] == 3
    assert unroutable["last_error"] == UNROUTABLE
    assert 100 <= unroutable["next_attempt_in_seconds"] <= 120
    assert unroutable["next_attempt_at"].endswith("+00:00")
    assert waiting[rows["due"]]["next_attempt_in_seconds"] == 0
    assert set(unroutable) >= {"message_id", "age_seconds"}
    assert "body" not in unroutable

    limited_run = await semel(settings, "outbox", "list", "--json", "--limit", "1")
    limited = orjson.loads(limited_run.stdout)
    assert [m["id"] for m in limited["waiting"]] == [rows["due"]]
    assert limited["counts"]["unsent"] == 4


async def test_the_table_shows_the_counts_first_then_why_each_waits(
    outbox: Rows, settings: Settings
) -> None:
    await _fill(outbox)
    listed = await semel(settings, "outbox", "list")
    assert listed.code == 0, listed.stderr
    assert BODY_MARKER not in listed.stdout
    lines = listed.stdout.splitlines()
    pairs = (line.rsplit("  ", 1) for line in lines[:8])
    counts = {name.strip(): value.strip() for name, value in pairs}
    assert counts.pop("oldest unsent").startswith("5m")
    assert counts == {
        "outbox table": outbox.table,
        "unsent": "4",
        "due now": "1",
        "backing off": "3",
        "refused by the broker": "3",
        "unroutable": "1",
        "older than 1m00s": "3",
    }
    table = "\n".join(lines[8:])
    for name in ("order-1", "order-2", "order-3", "order-4", "order.refunded", "shop.v2"):
        assert name in table, table
    assert "sent-long-ago" not in table
    assert "sent-just-now" not in table
    row = next(line for line in lines if "order-2" in line).split()
    assert row[1:4] == ["back-off", "unroutable", "in"], row
    row = next(line for line in lines if "order-4" in line).split()
    assert row[1:5] == ["back-off", "exchange", "not", "found"], row
    row = next(line for line in lines if "order-1" in line).split()
    assert row[1:4] == ["waiting", "-", "now"], row
    assert lines[-1] == "4 of 4 unsent messages shown"


async def test_a_piped_table_keeps_every_message_id_whole(outbox: Rows, settings: Settings) -> None:
    # Piped, with no COLUMNS, rich would cut the table to 80 columns and the ids to "…".
    await _fill(outbox)
    listed = await semel(settings, "outbox", "list", columns=None)
    assert listed.code == 0, listed.stderr
    answer = await semel(settings, "outbox", "list", "--json")
    for message in orjson.loads(answer.stdout)["waiting"]:
        assert message["message_id"] in listed.stdout, listed.stdout


async def test_an_empty_outbox_says_so(outbox: Rows, settings: Settings) -> None:
    listed = await semel(settings, "outbox", "list")
    assert listed.code == 0, listed.stderr
    assert "oldest unsent          -" in listed.stdout
    assert listed.stdout.splitlines()[-1] == "0 of 0 unsent messages shown"


@pytest.mark.parametrize("transactional", [False, True])
async def test_a_missing_table_is_one_line_naming_semel_migrate(
    settings: Settings, transactional: bool
) -> None:
    settings = in_mode(settings, transactional)
    listed = await semel(settings, "outbox", "list")
    assert listed.code == 2
    assert listed.stdout == ""
    assert listed.stderr == f"semel: error: {MISSING_TABLE.format(table=settings.outbox_table)}\n"
    assert "run `semel migrate`" in listed.stderr


@pytest.mark.parametrize(("ordering", "why"), [("per-key", "blocked"), ("oldest-first", "waiting")])
async def test_per_key_order_shows_a_message_held_behind_its_keys_back_off(
    outbox: Rows, settings: Settings, ordering: str, why: str
) -> None:
    await outbox.add(key="order-5", attempts=1, last_error=UNROUTABLE, retry_in=60)
    behind = await outbox.add(key="order-5")
    other = await outbox.add(key="order-6")
    settings = Settings(**(settings.model_dump() | {"outbox_ordering": ordering}))
    listed = await semel(settings, "outbox", "list", "--json")
    assert listed.code == 0, listed.stderr
    waiting = {m["id"]: m["why"] for m in orjson.loads(listed.stdout)["waiting"]}
    assert (waiting[behind], waiting[other]) == (why, "waiting")
