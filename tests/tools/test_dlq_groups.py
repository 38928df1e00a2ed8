"""``semel dlq groups`` and the filters of ``list``, ``groups`` and ``replay``, on the broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from semel.consumer import names
from semel.consumer.broker.letter_filters import Fingerprint
from semel.consumer.names import Reason, Topology
from semel.settings import Settings
from semel.stores.base import Outcome, Store
from tests.conftest import StoreFactory
from tests.tools.conftest import (
    FINGERPRINT,
    KEY_HEADER,
    drain,
    header,
    semel,
    semel_process,
    wait_for_depth,
)

pytestmark = pytest.mark.timeout(90)

REFUSED = ("httpx.ConnectError", "shop.payments:Client.charge:42")
DECLINED = ("shop.errors.CardDeclined", "shop.handlers:charge:17")


async def letter(
    channel: AbstractChannel,
    settings: Settings,
    key: str,
    reason: Reason,
    *,
    site: tuple[str, str] | None = None,
    error: str = "ConnectError: connection refused",
    routing_key: str = "order.paid",
    attempts: int = 5,
    age: timedelta = timedelta(minutes=3),
) -> None:
    """A dead letter as the worker writes it, through Q.dlx, confirmed."""
    headers: dict[str, Any] = {
        KEY_HEADER: key,
        names.H_REASON: reason.value,
        names.H_ERROR: error,
        names.H_ATTEMPTS: attempts,
        names.H_KEY: key,
        names.H_ORIGINAL_EXCHANGE: settings.exchange,
        names.H_ORIGINAL_ROUTING_KEY: routing_key,
        names.H_DEAD_LETTERED_AT: (datetime.now(UTC) - age).isoformat(timespec="milliseconds"),
    }
    if site is not None:
        headers[names.H_ERROR_TYPE], headers[names.H_ERROR_FRAME] = site
    message = aio_pika.Message(
        json.dumps({"order_id": key}).encode(),
        content_type="application/json",
        message_id=f"mid-{key}",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=headers,
    )
    dlx = await channel.get_exchange(Topology(settings.queue).dead_letter_exchange)
    await dlx.publish(message, names.DLQ_ROUTING_KEY, mandatory=True)


@pytest.fixture
async def incident(channel: AbstractChannel, settings: Settings, declared: None) -> int:
    """An hour of trouble: a downstream refusing, a card declined, a producer's bad bodies."""
    for n in range(4):
        await letter(
            channel, settings, f"order-{n}", Reason.MAX_ATTEMPTS, site=REFUSED,
            age=timedelta(minutes=10 * n + 1),
        )  # fmt: skip
    for n in range(2):
        await letter(
            channel, settings, f"refund-{n}", Reason.PERMANENT_ERROR, site=DECLINED,
            error="CardDeclined: Insufficient FUNDS", routing_key="refund.issued", attempts=1,
            age=timedelta(hours=3 + n),
        )  # fmt: skip
    await letter(
        channel, settings, "bad-1", Reason.MALFORMED_BODY, error="body is not JSON",
        routing_key="order.created", attempts=1, age=timedelta(days=2),
    )  # fmt: skip
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 7)
    return 7


async def json_of(settings: Settings, *args: str) -> Any:
    done = await semel(settings, "dlq", *args, "--json")
    assert done.code == 0, done.stderr
    return json.loads(done.stdout)


async def test_groups_counts_first_then_the_largest_group(
    settings: Settings, channel: AbstractChannel, incident: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = await json_of(settings, "groups")
    assert (shown["depth"], shown["read"], shown["matched"]) == (7, 7, 7)
    groups = shown["groups"]
    assert [(g["count"], g["reason"], g["error_type"], g["error_frame"]) for g in groups] == [
        (4, "max-attempts", *REFUSED),
        (2, "permanent-error", *DECLINED),
        (1, "malformed-body", None, None),
    ]
    refused = groups[0]
    assert refused["group"] == Fingerprint("max-attempts", *REFUSED).group_id
    assert refused["sample_key"] == "order-0"  # the latest
    assert refused["sample_error"] == "ConnectError: connection refused"
    first = datetime.fromisoformat(refused["first_seen"])
    last = datetime.fromisoformat(refused["last_seen"])
    assert timedelta(minutes=29) < last - first < timedelta(minutes=31)
    assert datetime.now(UTC) - last < timedelta(minutes=2)

    table = await semel(settings, "dlq", "groups")  # 80 columns
    assert table.code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "7 dead letters read, 3 groups"  # counts first
    for group in groups:  # never cut: an operator copies it into --group
        assert f" {group['group']} " in table.stdout
    for text in ("count", "error type", "frame", "ago", "malformed-body"):
        assert text in table.stdout
    monkeypatch.setenv("COLUMNS", "200")
    wide = (await semel(settings, "dlq", "groups")).stdout
    for text in (*REFUSED, *DECLINED, "sample error", "ConnectError: connection refused"):
        assert text in wide
    only = await semel(settings, "dlq", "groups", "--reason", "malformed-body")
    assert only.stdout.splitlines()[0] == "7 dead letters read, 1 matched, 1 groups"
    # Grouping takes nothing away.
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 7)
    assert len(await drain(channel, Topology(settings.queue).dead_letter_queue)) == 7


FILTERS: list[tuple[list[str], set[str]]] = [
    (["--reason", "permanent-error"], {"refund-0", "refund-1"}),
    (["--reason", "permanent-error", "--reason", "malformed-body"],
     {"refund-0", "refund-1", "bad-1"}),
    (["--key", "order-2"], {"order-2"}),
    (["--key-prefix", "refund-"], {"refund-0", "refund-1"}),
    (["--routing-key", "order.paid"], {f"order-{n}" for n in range(4)}),
    (["--routing-key", "order.*"], {f"order-{n}" for n in range(4)} | {"bad-1"}),
    (["--error", "insufficient funds"], {"refund-0", "refund-1"}),
    (["--since", "25m"], {"order-0", "order-1", "order-2"}),
    (["--until", "1h"], {"refund-0", "refund-1", "bad-1"}),
    (["--since", "1d", "--until", "1h"], {"refund-0", "refund-1"}),
    (["--min-attempts", "2"], {f"order-{n}" for n in range(4)}),
    (["--key-prefix", "order-", "--since", "15m"], {"order-0", "order-1"}),
    (["--error", "nothing like it"], set()),
]  # fmt: skip


async def test_every_filter_of_list_and_groups(settings: Settings, incident: int) -> None:
    refused = Fingerprint("max-attempts", *REFUSED).group_id
    cases = [*FILTERS, (["--group", refused], {f"order-{n}" for n in range(4)})]
    absolute = (datetime.now(UTC) - timedelta(minutes=25)).isoformat()
    cases.append((["--since", absolute], {"order-0", "order-1", "order-2"}))
    for options, keys in cases:
        listed = await json_of(settings, "list", *options)
        assert (listed["depth"], listed["matched"], listed["shown"]) == (7, len(keys), len(keys))
        assert {row["key"] for row in listed["dead_letters"]} == keys, options
        grouped = await json_of(settings, "groups", *options)
        assert sum(g["count"] for g in grouped["groups"]) == len(keys), options


async def test_list_counts_first_and_shows_groups(settings: Settings, incident: int) -> None:
    listed = await json_of(settings, "list", "--key-prefix", "order-", "--limit", "3")
    assert (listed["depth"], listed["matched"], listed["shown"]) == (7, 4, 3)
    refused = Fingerprint("max-attempts", *REFUSED).group_id
    row = listed["dead_letters"][0]
    assert (row["group"], row["error_type"], row["error_frame"]) == (refused, *REFUSED)

    table = await semel(settings, "dlq", "list", "--key-prefix", "order-", "--limit", "3")
    assert table.code == 0, table.stderr
    assert table.stdout.splitlines()[0] == "7 in the DLQ, 4 matched, 3 of 4 dead letters shown"
    assert table.stdout.count("order-") == 3
    plain = await semel(settings, "dlq", "list", "--limit", "2")
    assert plain.stdout.splitlines()[0] == "7 in the DLQ, 2 of 7 dead letters shown"


async def test_a_bad_time_or_group_option_is_a_usage_error(settings: Settings) -> None:
    for options in (["--since", "yesterday"], ["--until", "2h30"], ["--min-attempts", "-1"]):
        done = semel_process(settings, "dlq", "list", *options)
        assert done.code == 2, (options, done.stderr)
    done = semel_process(settings, "dlq", "list", "--since", "soon")
    assert "--since 'soon': give ISO 8601 or a time ago such as 90m, 2h, 3d" in done.stderr


@pytest.fixture
async def store(make_store: StoreFactory, settings: Settings) -> Store:
    return await make_store(**settings.model_dump(include={"key_prefix", "sqlite_path"}))


async def failed(store: Store, key: str) -> None:
    claim = await store.claim(key, FINGERPRINT)
    assert await store.fail(key, claim.fence, "ConnectError: connection refused")


async def test_replay_by_group_takes_that_group_alone(
    settings: Settings, channel: AbstractChannel, store: Store, incident: int
) -> None:
    for n in range(4):
        await failed(store, f"order-{n}")
    refused = Fingerprint("max-attempts", *REFUSED).group_id
    done = await semel(settings, "dlq", "replay", "--group", refused, "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {
        "replayed": 4,
        "kept": 3,
        "failed": 0,
        "reset": 4,
        "dry_run": False,
        "destinations": {f"{settings.exchange} / order.paid": 4},
    }
    names_ = Topology(settings.queue)
    await wait_for_depth(channel, settings.queue, 4)
    copies = await drain(channel, settings.queue)
    assert sorted(header(m, KEY_HEADER) for m in copies) == [f"order-{n}" for n in range(4)]
    assert all(names.H_ERROR_TYPE not in (m.headers or {}) for m in copies)  # starts afresh
    left = await drain(channel, names_.dead_letter_queue)
    assert sorted(header(m, names.H_KEY) for m in left) == ["bad-1", "refund-0", "refund-1"]
    assert (await store.claim("order-0", FINGERPRINT)).outcome is Outcome.CLAIMED


async def test_replay_filters_combine_and_old_options_mix_with_new(
    settings: Settings, channel: AbstractChannel, incident: int
) -> None:
    done = await semel(
        settings, "dlq", "replay", "--reason", "max-attempts", "--since", "15m", "--json"
    )
    assert done.code == 0, done.stderr
    # The store holds nothing for these keys: nothing to reset.
    assert json.loads(done.stdout) == {
        "replayed": 2,
        "kept": 5,
        "failed": 0,
        "reset": 0,
        "dry_run": False,
        "destinations": {f"{settings.exchange} / order.paid": 2},
    }
    await wait_for_depth(channel, settings.queue, 2)
    copies = await drain(channel, settings.queue)
    assert sorted(header(m, KEY_HEADER) for m in copies) == ["order-0", "order-1"]
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, 5)


@pytest.mark.usefixtures("declared")
async def test_replay_needs_a_filter_or_all_never_both(settings: Settings) -> None:
    for options in ([], ["--all", "--key-prefix", "order-"], ["--all", "--since", "1h"]):
        done = semel_process(settings, "dlq", "replay", *options)
        assert done.code == 2, (options, done.stderr)
        assert "give a filter or --all" in done.stderr
