"""``semel publish`` against the real broker: what lands in the work queue, and the counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from semel.consumer.commands.bad_inputs import EXPECTED_REASON, BadKind
from semel.consumer.delivery.message import KeySource, parse
from semel.consumer.errors import BadMessage
from semel.settings import Settings
from tests.tools.conftest import drain, header, semel, semel_process, wait_for_depth

pytestmark = pytest.mark.timeout(60)

KEY_HEADER = "Idempotency-Key"


async def test_count_with_duplicates_lands_count_plus_duplicates(
    settings: Settings, channel: AbstractChannel
) -> None:
    done = await semel(settings, "publish", "--count", "100", "--duplicates", "0.3", "--json")
    assert done.code == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary | {"key_prefix": None} == {
        "published": 130,
        "confirmed": 130,
        "returned": 0,
        "nacked": 0,
        "failed": 0,
        "not_sent": 0,
        "failed_keys": [],
        "error": None,
        "key_prefix": None,
    }
    await wait_for_depth(channel, settings.queue, 130)

    messages = await drain(channel, settings.queue)
    keys = Counter(header(m, KEY_HEADER) for m in messages)
    assert len(keys) == 100
    assert sorted(keys.values()) == [1] * 70 + [2] * 30
    assert all(k.startswith(summary["key_prefix"] + "-") for k in keys)
    source = KeySource.parse(settings.key_source)
    for message in messages:
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.routing_key == "order.paid"
        parsed = parse(
            message.body,
            message.content_type,
            message.headers,
            message.message_id,
            source=source,
            limit=settings.max_body_bytes,
        )
        assert parsed.body["order_id"] == parsed.key


async def test_concurrent_copies_arrive_back_to_back(
    settings: Settings, channel: AbstractChannel
) -> None:
    args = ["publish", "-n", "3", "--concurrent-copies", "4", "--key-prefix", "cc"]
    done = await semel(settings, *args)
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == "published 12, confirmed 12, returned 0, nacked 0"
    await wait_for_depth(channel, settings.queue, 12)
    keys = [header(m, KEY_HEADER) for m in await drain(channel, settings.queue)]
    assert keys == ["cc-1"] * 4 + ["cc-2"] * 4 + ["cc-3"] * 4


@pytest.mark.parametrize("kind", list(BadKind))
async def test_bad_kind_lands_as_claimed(
    settings: Settings, channel: AbstractChannel, kind: BadKind
) -> None:
    done = await semel(settings, "publish", "--bad", kind.value, "--key-prefix", "b")
    assert done.code == 0, done.stderr
    expected = 2 if kind is BadKind.KEY_REUSE else 1
    await wait_for_depth(channel, settings.queue, expected)
    messages = await drain(channel, settings.queue)
    source = KeySource.parse(settings.key_source)

    def reason_of(index: int) -> object:
        m = messages[index]
        try:
            parse(m.body, m.content_type, m.headers, m.message_id, source=source, limit=4096)
        except BadMessage as exc:
            return exc.reason
        return None

    key = f"b-{kind.value}-1"
    first = messages[0]
    if kind is BadKind.KEY_REUSE:
        assert [header(m, KEY_HEADER) for m in messages] == [key, key]
        assert messages[0].body != messages[1].body
        assert reason_of(0) is None  # each alone is fine: the store tells them apart
        assert reason_of(1) is None
        return
    assert reason_of(0) is EXPECTED_REASON[kind]
    expected_key: object = {
        BadKind.MISSING_KEY: None,
        BadKind.EMPTY_KEY: "",
        BadKind.NON_STRING_KEY: 1,
        BadKind.NON_PRINTABLE_KEY: key + "\x01",
    }.get(kind, key)
    if kind is BadKind.LONG_KEY:
        assert len(header(first, KEY_HEADER)) == 257
    else:
        assert header(first, KEY_HEADER) == expected_key
    checks = {
        BadKind.EMPTY_BODY: lambda: first.body == b"",
        BadKind.TOO_LARGE: lambda: len(first.body) > settings.max_body_bytes,
        BadKind.WRONG_CONTENT_TYPE: lambda: first.content_type == "text/plain",
        BadKind.JSON_ARRAY: lambda: isinstance(json.loads(first.body), list),
        BadKind.JSON_SCALAR: lambda: isinstance(json.loads(first.body), int),
        BadKind.NON_STRING_KEY: lambda: isinstance(header(first, KEY_HEADER), int),
    }
    assert checks.get(kind, lambda: True)()


async def test_unroutable_publish_counts_returned_and_exits_1(
    settings: Settings, channel: AbstractChannel
) -> None:
    # An exchange with no queue bound: every mandatory publish comes back.
    await channel.declare_exchange(settings.exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    done = semel_process(settings, "publish", "--count", "5", "--no-declare")
    assert done.code == 1, done.stderr
    assert done.stdout.strip() == "published 5, confirmed 0, returned 5, nacked 0"


async def test_routing_key_without_binding_is_returned(
    settings: Settings, channel: AbstractChannel
) -> None:
    bound = settings.model_copy(update={"binding_keys": ["order.*"]})
    done = await semel(bound, "publish", "-n", "2", "--routing-key", "invoice.sent", "--json")
    assert done.code == 1
    assert json.loads(done.stdout)["returned"] == 2
    ok = await semel(bound, "publish", "-n", "2", "--routing-key", "order.paid")
    assert ok.code == 0, ok.stderr


async def test_missing_exchange_is_one_line_and_exit_1(settings: Settings) -> None:
    done = await semel(settings, "publish", "--no-declare")
    assert done.code == 1
    assert done.stderr.startswith("semel: error: broker:")
    assert len(done.stderr.strip().splitlines()) == 1


async def test_body_from_file_with_a_fixed_key_and_a_progress_bar(
    settings: Settings, channel: AbstractChannel, tmp_path: Path
) -> None:
    body = tmp_path / "event.json"
    body.write_text('{"event": "order.paid", "order_id": "A-1", "amount": 5}')
    args = ["publish", "-n", "3", "--key", "A-1", "--body", f"@{body}", "--progress"]
    done = await semel(settings, *args, "--rate", "100")
    assert done.code == 0, done.stderr
    await wait_for_depth(channel, settings.queue, 3)
    messages = await drain(channel, settings.queue)
    assert {header(m, KEY_HEADER) for m in messages} == {"A-1"}
    assert {json.loads(m.body)["amount"] for m in messages} == {5}


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--body", "{not json"], "--body is not JSON"),
        (["--body", "@/nonexistent/body.json"], "cannot read"),
        (["--key", "k", "--key-prefix", "p"], "not both"),
        (["--duplicates", "2"], "Invalid value"),
        (["--bad", "no-such-kind"], "Invalid value"),
    ],
)
async def test_bad_usage_exits_2(settings: Settings, args: list[str], complaint: str) -> None:
    done = await semel(settings, "publish", *args)
    assert done.code == 2
    assert complaint in done.stderr
    assert "not json" not in done.stderr  # the body itself is never echoed


async def test_key_source_that_cannot_carry_a_bad_kind_exits_2(settings: Settings) -> None:
    by_id = settings.model_copy(update={"key_source": "message_id"})
    done = await semel(by_id, "publish", "--bad", "missing-key")
    assert done.code == 2
    assert "message_id" in done.stderr


@pytest.mark.parametrize("command", [["publish"], ["dlq", "list"], ["dlq", "replay", "--all"]])
def test_unreachable_broker_is_one_line_without_the_password(
    settings: Settings, command: list[str]
) -> None:
    nowhere = settings.model_copy(update={"amqp_url": "amqp://guest:s3cret@127.0.0.1:1/"})
    done = semel_process(nowhere, *command)
    assert done.code == 1
    assert done.stderr.startswith("semel: error: broker:")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "s3cret" not in done.stderr + done.stdout
