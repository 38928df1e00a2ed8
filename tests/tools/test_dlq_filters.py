"""Filters, fingerprints and groups of dead letters, and the filters' time options: no broker."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from semel.consumer.broker.dead_letters import DlqEntry
from semel.consumer.broker.letter_filters import (
    Fingerprint,
    LetterFilter,
    fingerprint,
    group_id,
    groups,
)
from semel.consumer.commands.dlq_filters import parse_when

pytestmark = pytest.mark.timeout(10)

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
FRAME = "shop.payments:Client.charge:42"


def letter(**fields: object) -> DlqEntry:
    base = DlqEntry(
        reason="max-attempts",
        key="order-1",
        attempts=5,
        error="ConnectError: [Errno 111] Connection refused",
        dead_lettered_at=NOW - timedelta(minutes=30),
        routing_key="order.paid",
        message_id="m-1",
        error_type="httpx.ConnectError",
        error_frame=FRAME,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_no_condition_matches_everything() -> None:
    everything = LetterFilter()
    assert everything.empty
    bare = DlqEntry(None, None, None, None, None, None, None)
    assert everything.matches(bare)
    assert everything.matches(letter())
    assert not LetterFilter(key="k").empty


def test_reasons_match_any_of_theirs() -> None:
    either = LetterFilter(reasons=frozenset({"max-attempts", "poison"}))
    assert either.matches(letter())
    assert either.matches(letter(reason="poison"))
    assert not either.matches(letter(reason="malformed-body"))
    assert not either.matches(letter(reason=None))


def test_key_is_exact_and_prefix_is_a_prefix() -> None:
    assert LetterFilter(key="order-1").matches(letter())
    assert not LetterFilter(key="order-").matches(letter())
    assert LetterFilter(key_prefix="order-").matches(letter())
    assert not LetterFilter(key_prefix="refund-").matches(letter())
    assert not LetterFilter(key_prefix="").matches(letter(key=None))  # no key, no match


def test_routing_key_is_a_topic_pattern() -> None:
    assert LetterFilter(routing_key="order.paid").matches(letter())
    assert LetterFilter(routing_key="order.*").matches(letter())
    assert LetterFilter(routing_key="#").matches(letter())
    assert not LetterFilter(routing_key="order").matches(letter())
    assert not LetterFilter(routing_key="refund.*").matches(letter())
    assert not LetterFilter(routing_key="#").matches(letter(routing_key=None))


def test_error_is_a_substring_in_any_case() -> None:
    assert LetterFilter(error="connection REFUSED").matches(letter())
    assert LetterFilter(error="errno 111").matches(letter())
    assert not LetterFilter(error="timeout").matches(letter())
    assert not LetterFilter(error="x").matches(letter(error=None))


def test_since_is_inclusive_until_exclusive_and_both_aware() -> None:
    at = NOW - timedelta(minutes=30)
    assert LetterFilter(since=at).matches(letter())
    assert not LetterFilter(since=at + timedelta(microseconds=1)).matches(letter())
    assert LetterFilter(until=at + timedelta(microseconds=1)).matches(letter())
    assert not LetterFilter(until=at).matches(letter())
    window = LetterFilter(since=NOW - timedelta(hours=1), until=NOW)
    assert window.matches(letter())
    assert not window.matches(letter(dead_lettered_at=NOW - timedelta(hours=2)))
    assert not window.matches(letter(dead_lettered_at=None))  # no time, no match
    # Another offset, the same instant.
    plus_one = at.astimezone(timezone(timedelta(hours=1)))
    assert LetterFilter(since=plus_one, until=plus_one + timedelta(seconds=1)).matches(letter())
    with pytest.raises(ValueError, match="aware"):
        LetterFilter(since=datetime(2026, 1, 1))  # naive: the point of the test
    with pytest.raises(ValueError, match="aware"):
        LetterFilter(until=datetime(2026, 1, 1))


def test_min_attempts() -> None:
    assert LetterFilter(min_attempts=5).matches(letter())
    assert not LetterFilter(min_attempts=6).matches(letter())
    assert LetterFilter(min_attempts=0).matches(letter(attempts=None))
    assert not LetterFilter(min_attempts=1).matches(letter(attempts=None))


def test_group_ids_match_any_of_theirs_in_any_case() -> None:
    mine = group_id(letter())
    assert LetterFilter(group_ids=frozenset({mine})).matches(letter())
    assert LetterFilter(group_ids=frozenset({mine.upper(), "0" * 10})).matches(letter())
    assert not LetterFilter(group_ids=frozenset({"0" * 10})).matches(letter())
    other_frame = letter(error_frame="shop.refunds:refund:7")
    assert not LetterFilter(group_ids=frozenset({mine})).matches(other_frame)


def test_every_condition_must_hold() -> None:
    both = LetterFilter(key_prefix="order-", reasons=frozenset({"poison"}))
    assert not both.matches(letter())
    assert both.matches(letter(reason="poison"))


def test_a_handlers_failure_is_fingerprinted_by_type_and_frame() -> None:
    assert fingerprint(letter()) == Fingerprint("max-attempts", "httpx.ConnectError", FRAME)
    permanent = letter(reason="permanent-error", error_type="ValueError", error_frame=None)
    assert fingerprint(permanent) == Fingerprint("permanent-error", "ValueError", None)


@pytest.mark.parametrize(
    "reason",
    ["malformed-body", "missing-key", "invalid-body", "payload-mismatch", "no-handler",
     "store-refused", "too-large", "invalid-key", "poison", None],
)  # fmt: skip
def test_bad_input_and_poison_are_grouped_by_reason_alone(reason: str | None) -> None:
    assert fingerprint(letter(reason=reason)) == Fingerprint(reason)


def test_a_dead_letter_from_before_the_headers_is_grouped_by_its_errors_type() -> None:
    old = letter(error_type=None, error_frame=None)
    assert fingerprint(old) == Fingerprint("max-attempts", "ConnectError", None)
    assert fingerprint(old).group_id != group_id(letter())
    assert fingerprint(letter(error_type=None, error_frame=None, error="TimeoutError")) == (
        Fingerprint("max-attempts", "TimeoutError", None)
    )
    unreadable = letter(error_type=None, error_frame=None, error="no type here")
    assert fingerprint(unreadable) == Fingerprint("max-attempts")


def test_group_ids_are_short_stable_and_tell_fingerprints_apart() -> None:
    # Pinned: an id an operator wrote down must name the same group next release.
    assert group_id(letter()) == Fingerprint("max-attempts", "httpx.ConnectError", FRAME).group_id
    assert group_id(letter()) == "9b8d2b892b"  # sha256 of reason, type, frame joined by \x1f
    assert Fingerprint("poison").group_id == "24668c1c81"
    assert len({group_id(letter()), group_id(letter(key="other", error="another text"))}) == 1
    ids = {
        group_id(letter()),
        group_id(letter(error_frame="shop.payments:Client.charge:43")),
        group_id(letter(error_type="httpx.ReadTimeout")),
        group_id(letter(reason="permanent-error")),
    }
    assert len(ids) == 4
    assert all(len(i) == 10 and int(i, 16) >= 0 for i in ids)


def test_groups_count_first_and_last_seen_and_sample() -> None:
    refused = [
        letter(key=f"order-{n}", dead_lettered_at=NOW - timedelta(minutes=n)) for n in (5, 1, 9)
    ]
    timeouts = [
        letter(
            key=f"refund-{n}",
            error_type="httpx.ReadTimeout",
            error="ReadTimeout: read timed out",
            dead_lettered_at=NOW - timedelta(minutes=n),
        )
        for n in (2, 3)
    ]
    malformed = [
        letter(reason="malformed-body", key="bad", error="not JSON", dead_lettered_at=None)
    ]
    found = groups([refused[0], timeouts[0], *malformed, refused[1], timeouts[1], refused[2]])
    assert [g.count for g in found] == [3, 2, 1]
    first = found[0]
    assert first.group_id == group_id(refused[0])
    assert first.fingerprint == Fingerprint("max-attempts", "httpx.ConnectError", FRAME)
    assert (first.first_seen, first.last_seen) == (
        NOW - timedelta(minutes=9),
        NOW - timedelta(minutes=1),
    )
    assert (first.sample_key, first.sample_error) == ("order-1", refused[1].error)  # the latest
    assert found[1].fingerprint.error_type == "httpx.ReadTimeout"
    assert (found[2].first_seen, found[2].last_seen) == (None, None)
    assert found[2].as_json() == {
        "group": Fingerprint("malformed-body").group_id,
        "count": 1,
        "reason": "malformed-body",
        "error_type": None,
        "error_frame": None,
        "first_seen": None,
        "last_seen": None,
        "sample_error": "not JSON",
        "sample_key": "bad",
    }
    assert found[0].as_json()["last_seen"] == (NOW - timedelta(minutes=1)).isoformat()


def test_groups_of_equal_count_latest_first_then_by_id() -> None:
    older = letter(error_type="A", dead_lettered_at=NOW - timedelta(hours=1))
    newer = letter(error_type="B", dead_lettered_at=NOW)
    undated = [letter(error_type=t, dead_lettered_at=None) for t in ("C", "D")]
    found = groups([older, *undated, newer])
    assert [g.fingerprint.error_type for g in found[:2]] == ["B", "A"]
    assert [g.group_id for g in found[2:]] == sorted(group_id(u) for u in undated)
    assert groups([]) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90m", NOW - timedelta(minutes=90)),
        ("2h", NOW - timedelta(hours=2)),
        ("3d", NOW - timedelta(days=3)),
        ("1w", NOW - timedelta(weeks=1)),
        ("30s", NOW - timedelta(seconds=30)),
        (" 2h ", NOW - timedelta(hours=2)),
        ("2026-11-27T10:00:00Z", datetime(2026, 11, 27, 10, tzinfo=UTC)),
        ("2026-11-27T10:00:00+01:00", datetime(2026, 11, 27, 9, tzinfo=UTC)),
        ("2026-11-27T10:00:00", datetime(2026, 11, 27, 10, tzinfo=UTC)),  # no offset: UTC
        ("2026-11-27", datetime(2026, 11, 27, tzinfo=UTC)),
    ],
)
def test_when_is_iso_8601_or_a_time_ago(text: str, expected: datetime) -> None:
    parsed = parse_when(text, NOW)
    assert parsed == expected
    assert parsed.tzinfo is not None


@pytest.mark.parametrize("text", ["", "2 h", "-2h", "2y", "h", "yesterday", "2026-13-01"])
def test_when_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - fromisoformat's own messages vary
        parse_when(text, NOW)


def test_a_time_without_an_offset_is_utc_whatever_the_machines_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The headers and the tables speak UTC; so does a time given without an offset."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert parse_when("2026-11-27T10:00:00", NOW) == datetime(2026, 11, 27, 10, tzinfo=UTC)
    finally:
        monkeypatch.undo()
        time.tzset()
