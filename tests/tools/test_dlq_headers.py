"""The pure parts of the DLQ tools: headers of a replayed copy, its route, timestamps,
selection, pacing."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from semel.consumer import names
from semel.consumer.broker.copies import stream_safe_headers
from semel.consumer.broker.dead_letters import (
    DlqEntry,
    Selection,
    entry_of,
    parse_instant,
    replay_headers,
)
from semel.consumer.broker.letter_filters import LetterFilter
from semel.consumer.letters.log import Letter, LogState
from semel.consumer.letters.reading import Destination, destination_of, listing
from semel.consumer.letters.replay import REPLAY_WINDOW, Pace, copy_headers, window_of
from semel.consumer.names import Reason

INSTANT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_replay_headers_drop_semel_and_broker_headers_but_the_route() -> None:
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
        names.H_REPLAYS: 2,
        names.H_LETTER_ID: "0" * 32,
        names.H_HEADERS: "{}",
        "x-semel-something-new": 1,
    }
    assert replay_headers(headers) == {
        "Idempotency-Key": "k",
        "x-trace": "t",
        "x-semelish": "kept: not the x-semel- prefix",
        names.H_ORIGINAL_EXCHANGE: "x",  # the producer's route: an app picks its handler by it
        names.H_ORIGINAL_ROUTING_KEY: "r",
        names.H_REPLAYS: 2,  # counted up by the replay (copy_headers)
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


def stored(headers: dict[str, Any], *, archived: bool = False) -> Letter:
    """A letter as a reading of the stream gives it, from the worker's headers."""
    kept = stream_safe_headers(headers) | {names.H_LETTER_ID: "a" * 32}
    return Letter(
        letter_id="a" * 32,
        entry=entry_of(kept, "dlq", "m-1", "a" * 32),
        body=b"{}",
        properties={"message_id": "m-1"},
        headers=kept,
        offset=0,
        written_at=INSTANT,
        archived_at=INSTANT if archived else None,
    )


PRODUCER = {
    "Idempotency-Key": "k",
    "x-context": {"tenant": "t-1", "tags": ["a", "b"], "limit": Decimal("1.50")},
    "x-amount": Decimal("9.99"),
}


def test_a_copy_carries_the_producers_headers_whole_the_route_and_one_more_replay() -> None:
    letter = stored(
        PRODUCER
        | {
            names.H_REASON: "max-attempts",
            names.H_ATTEMPTS: 5,
            names.H_ERROR: "e",
            names.H_ORIGINAL_EXCHANGE: "shop",
            names.H_ORIGINAL_ROUTING_KEY: "order.paid",
            names.H_REPLAYS: 2,
        }
    )
    assert "x-context" not in letter.headers  # the stream keeps no table as itself
    assert copy_headers(letter) == PRODUCER | {
        names.H_ORIGINAL_EXCHANGE: "shop",
        names.H_ORIGINAL_ROUTING_KEY: "order.paid",
        names.H_REPLAYS: 3,
    }
    first = stored({"Idempotency-Key": "k"})
    assert copy_headers(first) == {"Idempotency-Key": "k", names.H_REPLAYS: 1}


def test_a_copy_goes_by_the_producers_route_else_to_the_work_queue_or_where_told() -> None:
    routed = stored({names.H_ORIGINAL_EXCHANGE: "shop", names.H_ORIGINAL_ROUTING_KEY: "a.b"})
    assert destination_of(routed, "q") == Destination("shop", "a.b")
    assert destination_of(routed, "q", to="other") == Destination("", "other")
    fanout = stored({names.H_ORIGINAL_EXCHANGE: "shop", names.H_ORIGINAL_ROUTING_KEY: ""})
    assert destination_of(fanout, "q") == Destination("shop", "")
    direct = stored({names.H_ORIGINAL_EXCHANGE: "", names.H_ORIGINAL_ROUTING_KEY: "q"})
    assert destination_of(direct, "q") == Destination("", "q")
    assert destination_of(stored({}), "q") == Destination("", "q")
    no_key = stored({names.H_ORIGINAL_EXCHANGE: "shop"})
    assert destination_of(no_key, "q") == Destination("", "q")
    assert str(Destination("", "q")) == "queue 'q'"
    assert str(Destination("shop", "a.b")) == "exchange 'shop', routing key 'a.b'"


def test_a_listing_looks_at_one_set_and_counts_the_other() -> None:
    live = stored({names.H_KEY: "k-1"})
    kept = stored({names.H_KEY: "k-2"}, archived=True)
    state = LogState(letters={"1": live, "2": kept})
    everything = listing(state, LetterFilter())
    assert (everything.live, everything.archived, everything.read) == (1, 1, 1)
    assert (everything.matched, everything.others) == ([live], 1)
    stored_only = listing(state, LetterFilter(key="k-2"), archived=True)
    assert (stored_only.matched, stored_only.others, stored_only.read) == ([kept], 0, 1)


def test_pacing_windows() -> None:
    assert window_of(None) == REPLAY_WINDOW
    assert (window_of(0.5), window_of(20), window_of(2.5), window_of(1e6)) == (1, 20, 3, 100)


async def test_pace_spaces_copies_and_never_bursts() -> None:
    pace = Pace(50.0)
    started = time.monotonic()
    for _ in range(6):
        await pace.take()
    assert time.monotonic() - started >= 5 / 50
    await asyncio.sleep(0.2)  # idle time earns no burst
    again = time.monotonic()
    for _ in range(3):
        await pace.take()
    assert time.monotonic() - again >= 2 / 50
    unpaced = time.monotonic()
    for _ in range(1000):
        await Pace(None).take()
    assert time.monotonic() - unpaced < 1.0
