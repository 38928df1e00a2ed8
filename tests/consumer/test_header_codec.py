"""A dead letter's headers as tagged JSON and back, and import lines checked, without a server.

``semel dlq export`` writes the producer's headers and semel's as tagged JSON,
``semel dlq import`` publishes them again: every AMQP header type must come
back as it went in, and a line that is not a letter must be refused whole.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from pamqp.encode import field_table

from semel.consumer import names
from semel.consumer.broker.header_codec import (
    LineRefused,
    from_json_value,
    headers_from_json,
    headers_to_json,
    parse_import,
    to_json_value,
)

# Header values as aio-pika hands them over (pamqp decodes a byte array as a
# bytearray; bytes it cannot even encode).
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
    """Through the JSON text an export line holds."""
    return headers_from_json(json.loads(json.dumps(headers_to_json(headers))))


def test_every_header_type_comes_back_as_it_went_in() -> None:
    back = round_trip(EVERY_TYPE)
    assert back == EVERY_TYPE
    # Equal is not enough: True == 1, Decimal("12.3") == Decimal("12.30").
    for name, value in EVERY_TYPE.items():
        assert type(back[name]) is type(value), name
    assert str(back["decimal"]) == "12.30"
    assert str(back["array"][5]) == "7.0"
    assert str(back["table"]["a"]["b"]["c"][1]["d"]) == "-0.001"
    assert back["aware"].utcoffset() == timedelta(hours=2)
    assert type(back["array"][0]) is int
    assert type(back["table"]["f"]) is dict


def test_decoded_headers_can_be_published_again() -> None:
    """What an import sends: the client must encode every value (pamqp refuses
    ``bytes``; a byte array must come back as a ``bytearray``)."""
    field_table(round_trip(EVERY_TYPE))


def test_the_tagged_form_is_one_key_objects() -> None:
    assert headers_to_json({"n": 1, "d": Decimal("1.50"), "t": {"k": "v"}, "b": b"hi"}) == {
        "n": 1,
        "d": {"$decimal": "1.50"},
        "t": {"$table": {"k": "v"}},
        "b": {"$bytes": "aGk="},
    }


def test_a_naive_time_is_read_as_utc() -> None:
    naive = datetime(2026, 1, 2, 3, 4, 5)
    back = round_trip({"at": naive})["at"]
    assert back == naive.replace(tzinfo=UTC)
    assert back.utcoffset() == timedelta(0)


def test_bytes_and_a_tuple_come_back_as_a_byte_array_and_a_list() -> None:
    back = round_trip({"raw": b"\x01\x02", "pair": ("a", 1)})
    assert back == {"raw": bytearray(b"\x01\x02"), "pair": ["a", 1]}


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


@pytest.mark.parametrize(
    "data",
    [
        {"h": {"$nope": 1}},  # unknown tag
        {"h": {"plain": 1}},  # an untagged object
        {"h": {}},  # an object of no key
        {"h": {"$table": {"a": 1}, "$bytes": "aGk="}},  # two tags at once
        {"h": {"$table": [1, 2]}},  # a tag's value of the wrong type
        {"h": {"$bytes": 5}},
        {"h": {"$decimal": 1.5}},
        {"h": {"$time": 0}},
        {"h": {"$time": "yesterday"}},  # a tag's value that does not parse
        {"h": {"$bytes": "aGk"}},  # base64 without its padding
        {"h": {"$bytes": "!!!!"}},  # not base64 at all, read as b"" unless validated
        {"h": {"$decimal": "twelve"}},
        {"h": [1, {"$nope": 2}]},  # inside an array
        {"h": {"$table": {"k": {"$nope": 3}}}},  # inside a table
        [1, 2],  # not an object of headers
        "text",
    ],
)
def test_a_malformed_tagged_value_raises_value_error(data: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - base64's, decimal's and the codec's messages
        headers_from_json(data)


def test_a_value_with_no_amqp_form_is_refused_when_encoding() -> None:
    with pytest.raises(TypeError, match="object"):
        to_json_value(object())
    with pytest.raises(TypeError):
        headers_to_json({"set": {1, 2}})
    assert from_json_value(None) is None


GOOD = {"letter_id": "a" * 32, "body": "{}", "semel_headers": {names.H_KEY: "k-1"}}
BAD_LINES = [
    ("not json", "line 2"),
    (json.dumps({"body": "{}"}), "letter_id"),
    (json.dumps(GOOD | {"body_base64": "e30="}), "one of them"),
    (json.dumps(GOOD | {"headers": {"a": {"$decimal": "no"}}}), "decimal"),
    (json.dumps(GOOD | {"headers": {"big": 2**70}}), "cannot take"),
    (json.dumps(GOOD | {"properties": {"colour": "red"}}), "colour"),
    (json.dumps(GOOD | {"properties": {"priority": 256}}), "priority"),
    (json.dumps(GOOD | {"properties": {"timestamp": "noon"}}), "line 2"),
    (json.dumps({"letter_id": "x", "body_base64": "!!"}), "line 2"),
    (json.dumps(GOOD | {"semel_headers": {"plain": 1}}), "x-semel-"),
    (json.dumps(GOOD | {"headers": {names.H_KEY: "k"}}), "semel_headers"),
    (json.dumps(GOOD | {"body": "{}"} | {"letter_id": "b" * 32}), "line 1"),  # the same letter
]


@pytest.mark.parametrize(("bad", "said"), BAD_LINES)
def test_one_bad_line_refuses_the_whole_file_naming_it(bad: str, said: str) -> None:
    first = json.dumps(GOOD | {"letter_id": "b" * 32})
    with pytest.raises(LineRefused, match="nothing was imported") as refused:
        parse_import([first, bad, json.dumps(GOOD)])
    assert "line 2" in str(refused.value)
    assert said in str(refused.value)


def test_an_import_line_keeps_headers_but_the_rebuilt_ones_and_derives_its_ids() -> None:
    line = GOOD | {
        "headers": {"Idempotency-Key": "k-1"},
        "semel_headers": {
            names.H_KEY: "k-1",
            names.H_LETTER_ID: "old",
            names.H_ARCHIVED_AT: "2026-01-01T00:00:00+00:00",
            names.H_ARCHIVE_NOTE: "later",
            names.H_EDITED_FROM: "older",
        },
        "properties": {"message_id": "mid-1", "timestamp": "2026-01-02T03:04:05+00:00"},
    }
    (edit,) = parse_import(["", json.dumps(line), "  "])
    assert edit.line == 2
    message = edit.message(keep_message_id=False)
    assert message.headers == {
        "Idempotency-Key": "k-1",
        names.H_KEY: "k-1",
        names.H_LETTER_ID: edit.letter_id,
        names.H_EDITED_FROM: "a" * 32,
    }
    assert message.message_id not in (None, "mid-1")
    assert message.timestamp == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert edit.message(keep_message_id=True).message_id == "mid-1"
    # The same line gives the same letter id and message id; another body, others.
    (again,) = parse_import([json.dumps(line)])
    assert again.message(keep_message_id=False).message_id == message.message_id
    (edited,) = parse_import([json.dumps(line | {"body": '{"fixed": true}'})])
    assert edited.letter_id != edit.letter_id
