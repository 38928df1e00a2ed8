"""Reading a delivery: body, key and fingerprint (pure, no servers)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semel.consumer.delivery.facts import Origin, origin
from semel.consumer.delivery.message import (
    KeySource,
    best_effort_key,
    fingerprint,
    parse,
    parse_body,
)
from semel.consumer.errors import BadMessage
from semel.consumer.names import H_ORIGINAL_EXCHANGE, H_ORIGINAL_ROUTING_KEY, Reason

LIMIT = 1024
HEADER = KeySource.parse("header:Idempotency-Key")


def reason_of(body: bytes, content_type: str | None = "application/json") -> Reason:
    with pytest.raises(BadMessage) as info:
        parse_body(body, content_type, LIMIT)
    return info.value.reason


def test_json_object_is_parsed() -> None:
    assert parse_body(b'{"a": [1, 2], "b": null}', "application/json", LIMIT) == {
        "a": [1, 2],
        "b": None,
    }


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "Application/JSON; charset=utf-8"]
)
def test_json_content_types_are_accepted(content_type: str | None) -> None:
    assert parse_body(b"{}", content_type, LIMIT) == {}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"not json", "application/json"),
        (b"", "application/json"),
        (b"\xff\xfe{}", "application/json"),  # invalid UTF-8
        (b'{"a": "\xc3"}', "application/json"),  # truncated multi-byte character
        (b"42", "application/json"),
        (b'"text"', "application/json"),
        (b"[1, 2]", "application/json"),
        (b"null", "application/json"),
        (b'{"a": NaN}', "application/json"),
        (b"{}", "text/plain"),
        (b"{}", "application/xml"),
    ],
)
def test_malformed_bodies(body: bytes, content_type: str) -> None:
    assert reason_of(body, content_type) is Reason.MALFORMED_BODY


def test_too_large_is_checked_before_parsing() -> None:
    assert reason_of(b"x" * (LIMIT + 1)) is Reason.TOO_LARGE
    assert parse_body(b'{"k":"' + b"x" * (LIMIT - 8) + b'"}', None, LIMIT)


def test_big_integers_stay_exact() -> None:
    body = parse_body(b'{"n": 123456789012345678901234567890}', None, LIMIT)
    assert body["n"] == 123456789012345678901234567890
    assert fingerprint(body) != fingerprint({"n": 123456789012345678901234567891})


def test_fingerprint_is_canonical() -> None:
    one = parse_body(b'{"b": {"y": 1, "x": [1, "\\u00e9"]}, "a": 1}', None, LIMIT)
    two = parse_body('{"a":1,"b":{"x":[1,"é"],"y":1}}'.encode(), None, LIMIT)
    assert fingerprint(one) == fingerprint(two)
    assert len(fingerprint(one)) == 64
    assert fingerprint(one) != fingerprint({"a": 2, "b": {"x": [1, "é"], "y": 1}})


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("header:Idempotency-Key", "header", "Idempotency-Key"),
        ("message_id", "message_id", ""),
        ("body:order.id", "body", "order.id"),
    ],
)
def test_key_sources_parse(spec: str, kind: str, name: str) -> None:
    assert KeySource.parse(spec) == KeySource(kind, name)


def test_unknown_key_source_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown key source"):
        KeySource.parse("cookie:x")


def extract(source: KeySource, headers: dict[str, Any], message_id: str | None = None) -> str:
    return source.extract(headers, message_id, {"order": {"id": "o-1", "n": 7}})


def test_header_key_any_case() -> None:
    assert extract(HEADER, {"Idempotency-Key": "k1"}) == "k1"
    assert extract(HEADER, {"idempotency-key": "k2"}) == "k2"


def test_message_id_and_body_keys() -> None:
    assert extract(KeySource.parse("message_id"), {}, "m-1") == "m-1"
    assert extract(KeySource.parse("body:order.id"), {}) == "o-1"


@pytest.mark.parametrize(
    ("source", "headers", "message_id", "reason"),
    [
        (HEADER, {}, None, Reason.MISSING_KEY),
        (HEADER, {"Idempotency-Key": None}, None, Reason.MISSING_KEY),
        (HEADER, {"Idempotency-Key": ""}, None, Reason.INVALID_KEY),
        (HEADER, {"Idempotency-Key": "x" * 257}, None, Reason.INVALID_KEY),
        (HEADER, {"Idempotency-Key": "a\nb"}, None, Reason.INVALID_KEY),
        (HEADER, {"Idempotency-Key": "a\x00"}, None, Reason.INVALID_KEY),
        (HEADER, {"Idempotency-Key": 42}, None, Reason.INVALID_KEY),
        (HEADER, {"Idempotency-Key": b"bytes"}, None, Reason.INVALID_KEY),
        (KeySource.parse("message_id"), {}, None, Reason.MISSING_KEY),
        (KeySource.parse("message_id"), {}, "", Reason.MISSING_KEY),
        (KeySource.parse("body:order.missing"), {}, None, Reason.MISSING_KEY),
        (KeySource.parse("body:order.id.deeper"), {}, None, Reason.MISSING_KEY),
        (KeySource.parse("body:order.n"), {}, None, Reason.INVALID_KEY),
    ],
)
def test_bad_keys(
    source: KeySource, headers: dict[str, Any], message_id: str | None, reason: Reason
) -> None:
    with pytest.raises(BadMessage) as info:
        extract(source, headers, message_id)
    assert info.value.reason is reason


def test_longest_key_and_unicode_are_valid() -> None:
    assert extract(HEADER, {"Idempotency-Key": "é" * 256}) == "é" * 256
    assert extract(HEADER, {"Idempotency-Key": "order 1/2"}) == "order 1/2"


def test_parse_reads_body_before_key() -> None:
    with pytest.raises(BadMessage) as info:
        parse(b"nope", None, {}, None, source=HEADER, limit=LIMIT)
    assert info.value.reason is Reason.MALFORMED_BODY
    parsed = parse(b'{"a":1}', None, {"Idempotency-Key": "k"}, None, source=HEADER, limit=LIMIT)
    assert (parsed.key, parsed.body, parsed.fingerprint) == ("k", {"a": 1}, fingerprint({"a": 1}))


@pytest.mark.parametrize("body", [b'{"note": "\\ud800"}', b'{"\\udfff": 1}'])
def test_a_lone_surrogate_escape_is_malformed(body: bytes) -> None:
    with pytest.raises(BadMessage) as info:
        parse(body, None, {"Idempotency-Key": "k"}, None, source=HEADER, limit=LIMIT)
    assert info.value.reason is Reason.MALFORMED_BODY


def test_best_effort_key_for_dead_letters() -> None:
    assert best_effort_key({"Idempotency-Key": "k"}, None, HEADER) == "k"
    assert best_effort_key({}, None, HEADER) is None
    assert best_effort_key({}, "m", KeySource.parse("body:id")) is None


def test_origin_of_a_first_delivery() -> None:
    assert origin({}, "events", "order.paid", "q") == Origin("events", "order.paid")


def test_origin_of_a_retry_copy_comes_from_semel_headers() -> None:
    headers = {H_ORIGINAL_EXCHANGE: "events", H_ORIGINAL_ROUTING_KEY: "order.paid"}
    assert origin(headers, "", "q", "q") == Origin("events", "order.paid")


def test_origin_of_a_conflict_comes_from_the_work_queue_death() -> None:
    headers = {
        "x-death": [
            {"queue": "q.retry.conflict", "reason": "expired", "exchange": "q.retry",
             "routing-keys": ["conflict"], "count": 1},
            {"queue": "q", "reason": "rejected", "exchange": "events",
             "routing-keys": ["order.paid"], "count": 1},
        ]
    }  # fmt: skip
    assert origin(headers, "", "q", "q") == Origin("events", "order.paid")


def _json_without_floats() -> st.SearchStrategy[Any]:
    # Every character, control characters, U+2028, U+007F and astral planes
    # included; integers on both sides of orjson's 64-bit limit.
    text = st.text(st.characters(codec="utf-8"), max_size=12)
    ints = st.one_of(
        st.integers(), st.integers(-(2**64), 2**64).map(lambda n: n * 2 - 1), st.just(2**63)
    )
    scalars = st.one_of(st.none(), st.booleans(), ints, text)
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)
        ),
        max_leaves=20,
    )


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=6), _json_without_floats()))
def test_the_fast_fingerprint_is_the_canonical_one(body: dict[str, Any]) -> None:
    assert fingerprint(body, floats=False) == fingerprint(body)


@pytest.mark.parametrize("number", ["1e-05", "2.5e-07", "1e16", "0.1", "-0.0", "1E4"])
def test_a_body_with_a_float_keeps_the_standard_form(number: str) -> None:
    body = f'{{"k":"x","n":{number},"m":[1,{{"f":{number}}}]}}'.encode()
    parsed = parse(body, None, {}, None, source=KeySource.parse("body:k"), limit=LIMIT)
    canonical = json.dumps(parsed.body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert parsed.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()


def test_fingerprints_orjson_refuses_fall_back() -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    for body in ({"n": 2**64}, {"d": deep}):
        assert fingerprint(body, floats=False) == fingerprint(body)
    with pytest.raises(UnicodeEncodeError):
        fingerprint({"s": "\ud800"}, floats=False)
