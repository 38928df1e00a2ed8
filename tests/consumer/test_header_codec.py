"""The producer's headers as tagged JSON and back (``x-semel-headers``), without a server.

A dead letter's stream keeps only scalar header values, so the worker writes
the producer's headers whole into one string header; a replay and an export
read them back from it. Every AMQP header type must come back as it went in.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from pamqp.encode import field_table

from semel.consumer.broker.header_codec import (
    decode_headers,
    encode_headers,
    from_json_value,
    to_json_value,
)

# Header values as aio-pika hands them to the worker (pamqp decodes a byte array
# as a bytearray; bytes it cannot even encode).
EVERY_TYPE: dict[str, Any] = {
    "text": "zürich",
    "empty": "",
    "int": 7,
    "negative": -(2**40),
    "float": 1.25,
    "true": True,
    "false": False,
    "none": None,
    "bytes": bytearray(b"\x00\xff\x10"),
    "decimal": Decimal("12.30"),
    "aware": datetime(2026, 11, 27, 1, 30, 5, tzinfo=timezone(timedelta(hours=2))),
    "array": [1, "two", [3, [4]], {"five": 5}, bytearray(b"\x06"), Decimal("7.0"), None],
    "table": {"a": {"b": {"c": [1, {"d": Decimal("-0.001")}]}}, "e": bytearray(), "f": {}},
    "empty array": [],
    "empty table": {},
}


def round_trip(headers: dict[str, Any]) -> dict[str, Any]:
    return decode_headers(encode_headers(headers))


def test_every_header_type_comes_back_as_it_went_in() -> None:
    back = round_trip(EVERY_TYPE)
    assert back == EVERY_TYPE
    # Equal is not enough: True == 1, Decimal("12.3") == Decimal("12.30"). (Which
    # binary type a byte array comes back as is the next test's business.)
    for name, value in EVERY_TYPE.items():
        if not isinstance(value, bytearray):
            assert type(back[name]) is type(value), name
    assert str(back["decimal"]) == "12.30"
    assert str(back["array"][5]) == "7.0"
    assert str(back["table"]["a"]["b"]["c"][1]["d"]) == "-0.001"
    assert back["aware"].utcoffset() == timedelta(hours=2)
    assert type(back["array"][0]) is int
    assert type(back["table"]["f"]) is dict


def test_decoded_headers_can_be_published_again() -> None:
    """What a replay sends: aio-pika must be able to encode every value (pamqp
    refuses ``bytes``; a byte array must come back as a ``bytearray``)."""
    field_table(round_trip(EVERY_TYPE))


def test_the_encoded_form_is_one_compact_json_object_of_tagged_values() -> None:
    text = encode_headers({"n": 1, "d": Decimal("1.50"), "t": {"k": "v"}, "b": b"hi"})
    assert json.loads(text) == {
        "n": 1,
        "d": {"$decimal": "1.50"},
        "t": {"$table": {"k": "v"}},
        "b": {"$bytes": "aGk="},
    }
    assert " " not in text


def test_a_naive_time_is_read_as_utc() -> None:
    naive = datetime(2026, 1, 2, 3, 4, 5, 600)
    back = round_trip({"at": naive})["at"]
    assert back == naive.replace(tzinfo=UTC)
    assert back.utcoffset() == timedelta(0)


def test_an_aware_time_keeps_its_offset_and_microseconds() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))
    back = round_trip({"at": at})["at"]
    assert (back, back.utcoffset()) == (at, at.utcoffset())


def test_bytes_and_a_tuple_are_encoded_as_a_byte_array_and_a_list() -> None:
    back = round_trip({"raw": b"\x01\x02", "pair": ("a", 1)})
    assert back == {"raw": b"\x01\x02", "pair": ["a", 1]}


@pytest.mark.parametrize(
    "table",
    [
        {"$table": {"a": 1}},  # one key, a tag's name, a table's shape
        {"$bytes": "aGk="},  # one key, a tag's name, a valid tag's value
        {"$decimal": "1.5", "other": 2},
        {"$": "dollar"},
        {"$time": {"$decimal": "1"}},
    ],
)
def test_a_producer_table_whose_keys_start_with_a_dollar_reads_back_unchanged(
    table: dict[str, Any],
) -> None:
    back = round_trip({"x-table": table, "nested": [table, {"inner": table}]})
    assert back == {"x-table": table, "nested": [table, {"inner": table}]}


def test_header_names_that_look_like_tags_are_only_names() -> None:
    headers = {"$table": "plain", "$decimal": Decimal("2"), "$bytes": bytearray(b"\x00")}
    assert round_trip(headers) == headers


def test_no_headers_and_empty_text_are_no_headers() -> None:
    assert encode_headers({}) == "{}"
    assert decode_headers("{}") == {}
    assert decode_headers("") == {}
    assert decode_headers(None) == {}


def test_bytes_text_decodes_like_str() -> None:
    text = encode_headers(EVERY_TYPE)
    assert decode_headers(text.encode()) == decode_headers(text) == EVERY_TYPE


@pytest.mark.parametrize(
    "text",
    [
        '{"h": {"$nope": 1}}',  # unknown tag
        '{"h": {"plain": 1}}',  # an untagged object
        '{"h": {}}',  # an object of no key
        '{"h": {"$table": {"a": 1}, "$bytes": "aGk="}}',  # two tags at once
        '{"h": {"$table": [1, 2]}}',  # a tag's value of the wrong type
        '{"h": {"$bytes": 5}}',
        '{"h": {"$decimal": 1.5}}',
        '{"h": {"$time": 0}}',
        '{"h": {"$time": "yesterday"}}',  # a tag's value that does not parse
        '{"h": {"$bytes": "aGk"}}',  # base64 without its padding
        '{"h": [1, {"$nope": 2}]}',  # inside an array
        '{"h": {"$table": {"k": {"$nope": 3}}}}',  # inside a table
        "[1, 2]",  # not an object of headers
        '"text"',
        "{not json",
    ],
)
def test_a_malformed_tagged_value_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - json's, base64's and the codec's messages
        decode_headers(text)


@pytest.mark.parametrize(
    "value",
    [
        {"$decimal": "twelve"},  # Decimal() raises decimal.InvalidOperation, an ArithmeticError
        {"$bytes": "!!!!"},  # base64 that is not base64 at all, read as b"" unless validated
    ],
)
def test_a_tag_whose_text_does_not_parse_raises_value_error(value: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - whichever parser refuses it says why
        from_json_value(value)


def test_a_value_with_no_amqp_form_is_refused_when_encoding() -> None:
    with pytest.raises(TypeError, match="object"):
        to_json_value(object())
    with pytest.raises(TypeError):
        encode_headers({"set": {1, 2}})
