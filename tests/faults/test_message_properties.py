"""Generated inputs for the pure message reading of ``semel.consumer.delivery.message``: no servers.

Whatever headers and body arrive, reading a delivery either gives a valid
key and a fingerprint or raises :class:`BadMessage` with one of the parsing
reasons; the fingerprint does not change with key order or whitespace and
does change with the body.

Most generated JSON is text a UTF-8 document can carry; the last test adds
escapes of every code point, lone surrogates (``"\\ud800"``) included.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from semel.consumer.delivery.message import (
    KeySource,
    Parsed,
    fingerprint,
    parse,
    parse_body,
)
from semel.consumer.errors import BadMessage
from semel.consumer.names import MAX_KEY_LENGTH, Reason

pytestmark = pytest.mark.timeout(120)

PARSE_REASONS = {Reason.MALFORMED_BODY, Reason.TOO_LARGE, Reason.MISSING_KEY, Reason.INVALID_KEY}
SOURCES = ["header:Idempotency-Key", "message_id", "body:order.key", "body:key"]
CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "text/plain",
    "",
    "application/xml",
]

# Text without surrogates: what a UTF-8 JSON document can carry.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=16,
)
json_objects = st.dictionaries(text, json_values, max_size=6)

# What an AMQP header table can hold once decoded by the client.
header_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=300)
    | st.binary(max_size=8).map(bytearray)
)
header_values = st.recursive(
    header_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
header_names = st.sampled_from(["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"]) | text
headers = st.dictionaries(header_names, header_values, max_size=4)


def encoded(value: Any, draw_style: int) -> bytes:
    """``value`` as JSON text in one of several equivalent spellings."""
    styles: list[dict[str, Any]] = [
        {"separators": (",", ":")},
        {"indent": 2},
        {"indent": "\t", "ensure_ascii": False},
        {"separators": (" ,  ", " :  ")},
    ]
    return json.dumps(value, **styles[draw_style % len(styles)]).encode()


bodies = (
    st.binary(max_size=64)
    | st.builds(encoded, json_objects, st.integers(0, 3))
    | st.builds(encoded, json_values, st.integers(0, 3))
    | st.builds(
        lambda obj, key: encoded(obj | {"key": key, "order": {"key": key}}, 0),
        json_objects,
        header_scalars.filter(lambda v: not isinstance(v, bytearray)),
    )
)


def reordered(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def read(
    body: bytes,
    content_type: str | None,
    headers: dict[str, Any],
    message_id: str | None,
    source: KeySource,
    limit: int,
) -> Parsed | BadMessage:
    """The parsed delivery or the rejection; any other exception escapes and fails the test."""
    try:
        return parse(body, content_type, headers, message_id, source=source, limit=limit)
    except BadMessage as bad:
        return bad


@settings(max_examples=300, deadline=None)
@given(
    body=bodies,
    content_type=st.sampled_from(CONTENT_TYPES) | st.text(max_size=20),
    headers=headers,
    message_id=st.none() | st.text(max_size=300),
    source=st.sampled_from(SOURCES),
    limit=st.integers(1, 4096),
)
@example(b'{"key": "k"}', None, {}, None, "body:key", 1)  # over the limit by a mile
@example(b"[" * 5000 + b"]" * 5000, None, {"Idempotency-Key": "k"}, None, SOURCES[0], 10_000)
@example(b'{"n": 1' + b"0" * 5000 + b"}", None, {"Idempotency-Key": "k"}, None, SOURCES[0], 9000)
def test_reading_a_delivery_gives_a_valid_key_or_the_documented_rejection(
    body: bytes,
    content_type: str | None,
    headers: dict[str, Any],
    message_id: str | None,
    source: str,
    limit: int,
) -> None:
    outcome = read(body, content_type, headers, message_id, KeySource.parse(source), limit)
    if isinstance(outcome, BadMessage):
        assert outcome.reason in PARSE_REASONS
        assert str(outcome)  # the reason comes with a detail for x-semel-error
        return
    parsed = outcome
    assert isinstance(parsed.key, str)
    assert 1 <= len(parsed.key) <= MAX_KEY_LENGTH
    assert parsed.key.isprintable()
    assert isinstance(parsed.body, dict)
    assert len(parsed.fingerprint) == 64
    assert len(body) <= limit


@settings(max_examples=150, deadline=None)
@given(key=text.filter(lambda k: len(k) >= 1 and k.isprintable()), name=header_names)
def test_a_valid_header_key_is_read_whatever_the_case_of_the_header_name(
    key: str, name: str
) -> None:
    assume(name.lower() == "idempotency-key")
    parsed = parse(b"{}", None, {name: key}, None, source=KeySource.parse(SOURCES[0]), limit=10)
    assert parsed.key == key


@settings(max_examples=150, deadline=None)
@given(value=header_values)
def test_an_invalid_header_key_is_rejected_as_invalid_or_missing(value: Any) -> None:
    assume(not (isinstance(value, str) and 1 <= len(value) <= 256 and value.isprintable()))
    with pytest.raises(BadMessage) as rejected:
        parse(b"{}", None, {"Idempotency-Key": value}, None, source=KeySource.parse(SOURCES[0]),
              limit=10)  # fmt: skip
    expected = Reason.MISSING_KEY if value is None else Reason.INVALID_KEY
    assert rejected.value.reason is expected


@settings(max_examples=200, deadline=None)
@given(body=json_objects, style=st.integers(0, 3))
def test_the_fingerprint_ignores_key_order_and_whitespace(body: dict[str, Any], style: int) -> None:
    reference = fingerprint(parse_body(encoded(body, 0), None, 1 << 20))
    assert fingerprint(parse_body(encoded(body, style), None, 1 << 20)) == reference
    assert fingerprint(parse_body(encoded(reordered(body), style), None, 1 << 20)) == reference


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=100, deadline=None)
@given(first=json_objects, second=json_objects)
@example({"n": 2**53}, {"n": 2**53 + 1})  # beyond a double's precision: still different
@example({"n": 1}, {"n": True})
@example({"n": 1}, {"n": "1"})
@example({"n": None}, {})
@example({"a": {"b": 1}}, {"a.b": 1})
def test_different_bodies_have_different_fingerprints(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    one = parse_body(encoded(first, 1), None, 1 << 20)
    other = parse_body(encoded(second, 2), None, 1 << 20)
    assume(canonical(one) != canonical(other))
    assert fingerprint(one) != fingerprint(other)


@settings(max_examples=150, deadline=None)
@given(body=json_objects.filter(bool), data=st.data())
def test_changing_one_value_changes_the_fingerprint(body: dict[str, Any], data: Any) -> None:
    name = data.draw(st.sampled_from(sorted(body)))
    value = data.draw(json_values)
    assume(canonical(value) != canonical(body[name]))
    assert fingerprint(body | {name: value}) != fingerprint(body)


# JSON text may escape any code point, lone surrogates included.
any_text = st.text(
    st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(any_text, any_text, max_size=3))
@example({"note": "\ud800"})
def test_json_escaping_any_code_point_is_read_or_rejected_as_malformed(
    body: dict[str, str],
) -> None:
    raw = json.dumps(body).encode()  # every non-ASCII code point becomes a \u escape
    outcome = read(raw, None, {"Idempotency-Key": "k"}, None, KeySource.parse(SOURCES[0]), 1 << 16)
    if isinstance(outcome, BadMessage):
        assert outcome.reason is Reason.MALFORMED_BODY


def test_numbers_beyond_a_doubles_range_are_rejected_or_told_apart() -> None:
    source = KeySource.parse(SOURCES[0])
    outcomes = [
        read(body, None, {"Idempotency-Key": "k"}, None, source, 100)
        for body in (b'{"amount": 1e400}', b'{"amount": 1e999}')
    ]
    rejected = [o for o in outcomes if isinstance(o, BadMessage)]
    assert all(o.reason is Reason.MALFORMED_BODY for o in rejected)
    parsed = [o.fingerprint for o in outcomes if isinstance(o, Parsed)]
    assert len(set(parsed)) == len(parsed)
