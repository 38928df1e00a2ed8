"""What ``semel publish`` builds, checked without a broker against the consumer's own parser."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from semel.consumer.commands.bad_inputs import EXPECTED_REASON, BadKind
from semel.consumer.commands.traffic import Outgoing, PublishPlan, build_messages, default_body
from semel.consumer.delivery.message import KeySource, parse
from semel.consumer.errors import BadMessage, PlanError

LIMIT = 4096
HEADER = KeySource.parse("header:Idempotency-Key")


def _parse(message: Outgoing, source: KeySource = HEADER) -> str:
    parsed = parse(
        message.body,
        message.content_type,
        message.headers,
        message.message_id,
        source=source,
        limit=LIMIT,
    )
    return parsed.key


def test_count_duplicates_and_copies() -> None:
    plan = PublishPlan(count=10, duplicates=0.3, concurrent_copies=2, key_prefix="p")
    messages = build_messages(plan, HEADER, LIMIT, random.Random(7))
    assert len(messages) == 10 * 2 + 3
    keys = [_parse(m) for m in messages]
    assert keys[:4] == ["p-1", "p-1", "p-2", "p-2"]  # copies back to back
    assert set(Counter(keys).values()) == {2, 3}
    assert sum(1 for n in Counter(keys).values() if n == 3) == 3
    by_key = {k: m.body for k, m in zip(keys, messages, strict=True)}
    assert all(m.body == by_key[k] for k, m in zip(keys, messages, strict=True))


def test_default_body_is_an_order_paid_event_the_example_handler_accepts() -> None:
    from semel.consumer.delivery.handler import Context
    from semel.consumer.examples import order_paid

    body = default_body("p-1")
    assert body == default_body("p-1")
    assert body["event"] == "order.paid"
    context = Context("p-1", body, {}, "order.paid", None, attempt=1, fence=1)
    assert order_paid(context)["status"] == "recorded"


def test_fixed_key_sends_the_same_body_every_time() -> None:
    messages = build_messages(PublishPlan(count=3, key="order-7"), HEADER, LIMIT)
    assert {_parse(m) for m in messages} == {"order-7"}
    assert len({m.body for m in messages}) == 1


@pytest.mark.parametrize("kind", list(BadKind))
@pytest.mark.parametrize("source", ["header:Idempotency-Key", "body:order_id", "message_id"])
def test_every_bad_kind_is_rejected_with_its_reason(kind: BadKind, source: str) -> None:
    key_source = KeySource.parse(source)
    plan = PublishPlan(count=1, bad=(kind,), key_prefix="p")
    try:
        messages = build_messages(plan, key_source, LIMIT)
    except PlanError:
        assert source == "message_id"  # an AMQP message id cannot carry these
        return
    if kind is BadKind.KEY_REUSE:
        first, second = messages
        assert _parse(first, key_source) == _parse(second, key_source)
        assert first.body != second.body
        return
    (message,) = messages
    with pytest.raises(BadMessage) as caught:
        _parse(message, key_source)
    assert caught.value.reason is EXPECTED_REASON[kind]


def test_bad_keys_name_their_kind() -> None:
    plan = PublishPlan(count=2, bad=(BadKind.NOT_JSON, BadKind.KEY_REUSE), key_prefix="p")
    messages = build_messages(plan, HEADER, LIMIT)
    keys = [m.headers["Idempotency-Key"] for m in messages]
    assert keys == [
        *("p-not-json-1", "p-key-reuse-1", "p-key-reuse-1"),
        *("p-not-json-2", "p-key-reuse-2", "p-key-reuse-2"),
    ]


def test_body_source_puts_the_key_on_a_nested_path() -> None:
    source = KeySource.parse("body:meta.key")
    plan = PublishPlan(count=1, body={"meta": {"other": 1}, "x": 2}, key_prefix="p")
    (message,) = build_messages(plan, source, LIMIT)
    assert _parse(message, source) == "p-1"
    assert b'"other":1' in message.body


def test_message_id_source_uses_the_key_as_message_id() -> None:
    source = KeySource.parse("message_id")
    messages = build_messages(PublishPlan(count=2, concurrent_copies=2, key_prefix="p"), source, 9)
    assert [m.message_id for m in messages] == ["p-1", "p-1", "p-2", "p-2"]


@pytest.mark.parametrize(
    "plan",
    [
        PublishPlan(count=0),
        PublishPlan(duplicates=1.5),
        PublishPlan(concurrent_copies=0),
        PublishPlan(body=[1, 2], bad=(BadKind.KEY_REUSE,)),
        PublishPlan(body="text", bad=(BadKind.TOO_LARGE,)),
    ],
)
def test_impossible_plans_are_refused(plan: PublishPlan) -> None:
    with pytest.raises(PlanError):
        build_messages(plan, HEADER, LIMIT)


def test_body_source_needs_an_object_body() -> None:
    with pytest.raises(PlanError):
        build_messages(PublishPlan(body=[1]), KeySource.parse("body:id"), LIMIT)
