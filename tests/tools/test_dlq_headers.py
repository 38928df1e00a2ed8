"""The pure parts of the DLQ tools: header stripping, timestamps, selection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from semel.consumer import names
from semel.consumer.broker.dead_letters import DlqEntry, Selection, parse_instant, replay_headers
from semel.consumer.names import H_TURN, Reason

INSTANT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_replay_headers_drop_semel_and_broker_headers_but_the_route_and_replays() -> None:
    headers = {
        "Idempotency-Key": "k",
        "x-trace": "t",
        "x-semelish": "kept: not the x-semel- prefix",
        **{h: "v" for h in names.BROKER_HEADERS},
        names.H_ATTEMPTS: 3,
        names.H_REASON: "max-attempts",
        names.H_ERROR: "e",
        names.H_KEY: "k",
        names.H_ORIGINAL_EXCHANGE: "x",
        names.H_ORIGINAL_ROUTING_KEY: "r",
        names.H_FIRST_SEEN: "f",
        names.H_DEAD_LETTERED_AT: "d",
        names.H_LETTER_ID: "a new copy is a new letter",
        names.H_REPLAYS: 2,
        names.H_ARCHIVED_AT: "a",
        H_TURN: "t",
        "x-semel-something-new": 1,
    }
    assert replay_headers(headers) == {
        "Idempotency-Key": "k",
        "x-trace": "t",
        "x-semelish": "kept: not the x-semel- prefix",
        names.H_ORIGINAL_EXCHANGE: "x",  # the producer's route: an app picks its handler by it
        names.H_ORIGINAL_ROUTING_KEY: "r",
        names.H_REPLAYS: 2,  # counted on by the replay that sends it
    }


@pytest.mark.parametrize(
    "value",
    [
        INSTANT,
        INSTANT.replace(tzinfo=None),
        INSTANT.isoformat(),
        "2026-01-02T03:04:05Z",
        INSTANT.timestamp(),
        int(INSTANT.timestamp() * 1000),
        str(INSTANT.timestamp()).encode(),
    ],
)
def test_parse_instant_reads_every_timestamp_shape(value: object) -> None:
    assert parse_instant(value) == INSTANT


@pytest.mark.parametrize("value", [None, "", "yesterday", b"\xff", 10**30, True])
def test_parse_instant_gives_up_quietly(value: object) -> None:
    assert parse_instant(value) is None


def _letter(key: str | None, reason: str | None) -> DlqEntry:
    return DlqEntry(reason, key, 1, None, INSTANT, "order.paid", None)


def test_selection() -> None:
    letter = _letter("k", "poison")
    assert Selection(everything=True).matches(letter)
    assert Selection(key="k").matches(letter)
    assert not Selection(key="other").matches(letter)
    assert Selection(reason=Reason.POISON).matches(letter)
    assert not Selection(reason=Reason.MAX_ATTEMPTS).matches(letter)
    assert not Selection().matches(letter)
    assert not Selection(key="k").matches(_letter(None, "poison"))


def test_age_and_json() -> None:
    letter = _letter("k", "poison")
    later = INSTANT + timedelta(seconds=90)
    assert letter.age(later) == timedelta(seconds=90)
    assert letter.as_json(later)["age_seconds"] == 90.0
    assert _letter("k", None).as_json(later)["reason"] is None
    no_time = DlqEntry(None, None, None, None, None, None, None)
    assert no_time.age(later) is None
    assert no_time.as_json(later)["dead_lettered_at"] is None
