"""``semel dlq list`` and ``semel dlq replay`` against the real broker and real stores."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity, DeliveryError

from semel.consumer import names
from semel.consumer.broker import dead_letters as dlq
from semel.consumer.broker import letter_runs, topology
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.stores.base import Outcome, Store
from semel.stores.errors import StoreUnavailable
from tests.conftest import Rabbitmqctl, StoreFactory
from tests.tools.conftest import (
    FINGERPRINT,
    KEY_HEADER,
    dead_letter,
    depth,
    drain,
    eventually,
    header,
    semel,
    semel_process,
    wait_for_depth,
)

pytestmark = pytest.mark.timeout(90)


async def failed_key(store: Store, key: str) -> None:
    """The store state the consumer leaves before dead-lettering: claimed, then failed."""
    claim = await store.claim(key, FINGERPRINT)
    assert claim.outcome is Outcome.CLAIMED
    assert await store.fail(key, claim.fence, "RuntimeError: no")
    assert (await store.claim(key, FINGERPRINT)).outcome is Outcome.FAILED


@pytest.mark.usefixtures("declared")
async def test_list_shows_dead_letters_and_leaves_the_dlq_as_it_was(
    settings: Settings, channel: AbstractChannel
) -> None:
    dlq_name = Topology(settings.queue).dead_letter_queue
    await dead_letter(channel, settings, "k-1", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "k-2", Reason.PERMANENT_ERROR, attempts=1)
    await dead_letter(channel, settings, "k-3", Reason.POISON, age=timedelta(hours=2))
    await wait_for_depth(channel, dlq_name, 3)

    done = await semel(settings, "dlq", "list", "--json")
    assert done.code == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["depth"] == 3
    rows = {row["key"]: row for row in listing["dead_letters"]}
    assert set(rows) == {"k-1", "k-2", "k-3"}
    assert rows["k-2"]["reason"] == "permanent-error"
    assert rows["k-2"]["attempts"] == 1
    assert rows["k-1"]["routing_key"] == "order.paid"
    assert rows["k-1"]["error"].startswith("RuntimeError: payment service")
    assert 170 < rows["k-1"]["age_seconds"] < 600
    assert rows["k-3"]["age_seconds"] > 7000
    assert {(row["replays"], row["archived_at"]) for row in rows.values()} == {(0, None)}
    assert len({row["letter_id"] for row in rows.values()}) == 3
    await wait_for_depth(channel, dlq_name, 3)

    table = await semel(settings, "dlq", "list")
    assert table.code == 0, table.stderr
    for text in ("reason", "replays", "max-attempts", "k-2", "poison", "2h00m", "order.paid"):
        assert text in table.stdout
    assert "x" * 100 not in table.stdout  # errors are truncated in the table
    assert "3 of 3 dead letters shown" in table.stdout
    await wait_for_depth(channel, dlq_name, 3)

    limited = json.loads((await semel(settings, "dlq", "list", "--json", "--limit", "2")).stdout)
    assert len(limited["dead_letters"]) == 2
    await wait_for_depth(channel, dlq_name, 3)
    # Still all there, unchanged, for a consumer of the DLQ.
    keys = sorted(header(m, names.H_KEY) for m in await drain(channel, dlq_name))
    assert keys == ["k-1", "k-2", "k-3"]


async def test_list_on_a_fresh_broker_declares_the_topology(
    settings: Settings,
    connection: AbstractConnection,  # deletes what the command declared
) -> None:
    done = semel_process(settings, "dlq", "list")
    assert done.code == 0, done.stderr
    assert "0 of 0 dead letters shown" in done.stdout


def assert_replayed_copy(message: aio_pika.abc.AbstractIncomingMessage, key: str) -> None:
    headers = message.headers or {}
    # Of semel's headers, only the producer's route (an app picks its handler by
    # it) and the replay count are carried: attempts, reason and error start afresh.
    kept = {names.H_ORIGINAL_EXCHANGE, names.H_ORIGINAL_ROUTING_KEY, names.H_REPLAYS}
    assert {h for h in headers if h.startswith(names.SEMEL_HEADER_PREFIX)} <= kept
    assert headers[names.H_REPLAYS] == 1
    # A quorum queue stamps x-delivery-count on every delivery, starting at 0.
    assert not [h for h in headers if h in names.BROKER_HEADERS and h != "x-delivery-count"]
    assert headers.get("x-delivery-count", 0) == 0
    assert headers[KEY_HEADER] == key
    assert headers["x-trace"] == "keep-me"
    assert message.message_id == f"mid-{key}"
    assert message.correlation_id == f"corr-{key}"
    assert message.app_id == "shop"
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert json.loads(message.body)["order_id"] == key


async def claims_again(store: Store, key: str) -> bool:
    return (await store.claim(key, FINGERPRINT)).outcome is Outcome.CLAIMED


@pytest.fixture
async def store(make_store: StoreFactory, settings: Settings) -> Store:
    """The store the commands use: the same backend, path and key prefix as ``settings``."""
    return await make_store(**settings.model_dump(include={"key_prefix", "sqlite_path"}))


BACKENDS = ["sqlite", "redis", "postgres", "dynamodb-moto"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("declared")
async def test_replay_by_key(settings: Settings, channel: AbstractChannel, store: Store) -> None:
    names_ = Topology(settings.queue)
    for key in ("a", "b"):
        await failed_key(store, key)
    await dead_letter(channel, settings, "a", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "b", Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, names_.dead_letter_queue, 2)

    done = await semel(settings, "dlq", "replay", "--key", "a")
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == "replayed 1, kept 1"

    await wait_for_depth(channel, settings.queue, 1)
    (copy,) = await drain(channel, settings.queue)
    assert_replayed_copy(copy, "a")
    # Back the way the producer sent it: its exchange and routing key.
    assert (copy.exchange, copy.routing_key) == (settings.exchange, "order.paid")
    (left,) = await drain(channel, names_.dead_letter_queue)
    assert header(left, names.H_KEY) == "b"
    assert await claims_again(store, "a")
    assert (await store.claim("b", FINGERPRINT)).outcome is Outcome.FAILED


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("declared")
async def test_replay_by_reason(settings: Settings, channel: AbstractChannel, store: Store) -> None:
    names_ = Topology(settings.queue)
    for key in ("p-1", "p-2", "m-1"):
        await failed_key(store, key)
    await dead_letter(channel, settings, "p-1", Reason.PERMANENT_ERROR)
    await dead_letter(channel, settings, "m-1", Reason.MAX_ATTEMPTS)
    await dead_letter(channel, settings, "p-2", Reason.PERMANENT_ERROR)
    await wait_for_depth(channel, names_.dead_letter_queue, 3)

    done = await semel(settings, "dlq", "replay", "--reason", "permanent-error", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {
        "replayed": 2,
        "kept": 1,
        "failed": 0,
        "reset": 2,
        "dry_run": False,
        "destinations": {f"{settings.exchange} / order.paid": 2},
    }

    await wait_for_depth(channel, settings.queue, 2)
    copies = await drain(channel, settings.queue)
    for copy, key in zip(copies, ("p-1", "p-2"), strict=True):
        assert_replayed_copy(copy, key)
    (left,) = await drain(channel, names_.dead_letter_queue)
    assert header(left, names.H_REASON) == "max-attempts"
    assert await claims_again(store, "p-1")
    assert await claims_again(store, "p-2")
    assert (await store.claim("m-1", FINGERPRINT)).outcome is Outcome.FAILED


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("declared")
async def test_replay_all(settings: Settings, channel: AbstractChannel, store: Store) -> None:
    names_ = Topology(settings.queue)
    await failed_key(store, "x-1")
    await failed_key(store, "x-2")
    await dead_letter(channel, settings, "x-1", Reason.POISON)
    await dead_letter(channel, settings, "x-2", Reason.MAX_ATTEMPTS)
    # A completed key whose too-large copy was dead-lettered: its record must survive.
    claim = await store.claim("done", FINGERPRINT)
    assert await store.complete("done", claim.fence, {"ok": True})
    await dead_letter(channel, settings, "done", Reason.TOO_LARGE)
    await wait_for_depth(channel, names_.dead_letter_queue, 3)

    done = await semel(settings, "dlq", "replay", "--all")
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == "replayed 3, kept 0"
    await wait_for_depth(channel, names_.dead_letter_queue, 0)
    await wait_for_depth(channel, settings.queue, 3)
    copies = {header(m, KEY_HEADER): m for m in await drain(channel, settings.queue)}
    for key, copy in copies.items():
        assert_replayed_copy(copy, key)
    assert await claims_again(store, "x-1")
    assert await claims_again(store, "x-2")
    assert (await store.claim("done", FINGERPRINT)).outcome is Outcome.DUPLICATE


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("declared")
async def test_replay_run_again_after_its_copy_completed_replays_a_duplicate(
    settings: Settings, channel: AbstractChannel, store: Store
) -> None:
    """A replay interrupted after its reset and its confirmed copy, before the
    ack: the copy ran and completed, the dead letter is still there. Running
    the replay again must not reopen the key."""
    names_ = Topology(settings.queue)
    await failed_key(store, "again")
    await dead_letter(channel, settings, "again", Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, names_.dead_letter_queue, 1)
    assert await store.reset("again")  # the interrupted run's reset
    copy = await store.claim("again", FINGERPRINT)  # its copy, run to completion
    assert await store.complete("again", copy.fence, {"paid": True})

    done = await semel(settings, "dlq", "replay", "--all", "--json")
    assert done.code == 0, done.stderr
    counts = json.loads(done.stdout)
    assert {k: counts[k] for k in ("replayed", "kept", "failed", "reset")} == {
        "replayed": 1,
        "kept": 0,
        "failed": 0,
        "reset": 0,
    }
    duplicate = await store.claim("again", FINGERPRINT)
    assert duplicate.outcome is Outcome.DUPLICATE
    assert duplicate.record.result == {"paid": True}


async def test_replay_without_a_selection_exits_2(settings: Settings) -> None:
    done = semel_process(settings, "dlq", "replay")
    assert done.code == 2
    assert "--key, --reason or --all" in done.stderr
    both = semel_process(settings, "dlq", "replay", "--all", "--key", "k")
    assert both.code == 2


@pytest.fixture
async def full_work_queue(
    settings: Settings, channel: AbstractChannel, declared: None, rabbitmqctl: Rabbitmqctl
) -> AsyncIterator[None]:
    """The work queue refuses every publish: a policy caps it at zero messages.

    The quorum work queue overflows with reject-publish, so the broker NACKs.
    """
    policy = f"full-{settings.queue}"
    cap = ["set_policy", "--apply-to", "queues", policy, f"^{settings.queue}$", '{"max-length": 0}']
    await rabbitmqctl(*cap)

    async def refused() -> bool:
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(b"{}"), settings.queue, mandatory=True
            )
        except DeliveryError:
            return True
        return False

    await eventually(refused, deadline=20)
    yield
    await rabbitmqctl("clear_policy", policy)


@pytest.mark.usefixtures("full_work_queue")
async def test_unconfirmed_replay_leaves_the_dead_letter(
    settings: Settings, channel: AbstractChannel, store: Store
) -> None:
    dlq_name = Topology(settings.queue).dead_letter_queue
    await failed_key(store, "stuck")
    await dead_letter(channel, settings, "stuck", Reason.PERMANENT_ERROR)
    await wait_for_depth(channel, dlq_name, 1)
    work_depth = await depth(channel, settings.queue)  # probes taken before the policy held
    started = time.monotonic()
    done = await semel(settings, "dlq", "replay", "--all")
    assert done.code == 1
    assert done.stdout.strip() == "replayed 0, kept 0, failed 1"
    assert time.monotonic() - started < 30
    await wait_for_depth(channel, dlq_name, 1)
    (left,) = await drain(channel, dlq_name)
    assert header(left, names.H_KEY) == "stuck"
    assert await depth(channel, settings.queue) == work_depth


@pytest.mark.usefixtures("declared")
async def test_store_trouble_midway_leaves_the_rest_in_the_dlq(
    settings: Settings, channel: AbstractChannel, connection: AbstractConnection
) -> None:
    dlq_name = Topology(settings.queue).dead_letter_queue
    for key in ("s-1", "s-2", "s-3"):
        await dead_letter(channel, settings, key, Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, dlq_name, 3)
    reset_keys: list[str] = []

    async def reset(key: str, fingerprint: str | None = None) -> bool:
        reset_keys.append(key)
        if len(reset_keys) == 2:
            raise StoreUnavailable("redis", "connection refused")
        return True

    replaying = await connection.channel(publisher_confirms=True, on_return_raises=True)
    everything = dlq.Selection(everything=True)
    with pytest.raises(StoreUnavailable):
        await letter_runs.replay(connection, replaying, Topology(settings.queue), everything, reset)
    await wait_for_depth(channel, settings.queue, 1)  # the first one, confirmed before the outage
    await wait_for_depth(channel, dlq_name, 2)
    assert sorted(header(m, names.H_KEY) for m in await drain(channel, dlq_name)) == ["s-2", "s-3"]


@pytest.mark.parametrize("backend", ["redis"])
@pytest.mark.usefixtures("declared")
async def test_unreachable_store_is_one_line_and_leaves_the_dlq(
    settings: Settings, channel: AbstractChannel
) -> None:
    dlq_name = Topology(settings.queue).dead_letter_queue
    await dead_letter(channel, settings, "r-1", Reason.MAX_ATTEMPTS)
    await wait_for_depth(channel, dlq_name, 1)
    nowhere = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    done = semel_process(nowhere, "dlq", "replay", "--all")
    assert done.code == 1
    assert done.stderr.startswith("semel: error: redis store unavailable")
    assert len(done.stderr.strip().splitlines()) == 1
    await wait_for_depth(channel, dlq_name, 1)
    assert await depth(channel, settings.queue) == 0


async def test_the_dlq_commands_leave_an_app_handlers_queue_as_its_worker_declared_it(
    settings: Settings, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """``SEMEL_QUEUE`` naming an app handler's queue: listing and replaying its dead
    letters add no ``#`` binding (``SEMEL_BINDING_KEYS``' default) and no retry tier
    of the default delays. Seen failing before: after ``semel dlq list`` the queue
    took every routing key, and every event no handler of it takes would have
    been dead-lettered there as ``no-handler``."""
    own = replace(topology_of(settings), binding_keys=("orders.paid",), retry_delays=(2.0,))
    await topology.declare(connection, own)
    # Its own route, so that its replay reaches the queue.
    await dead_letter(channel, settings, "k-1", Reason.INVALID_BODY, routing_key="orders.paid")
    for command in (["dlq", "list"], ["dlq", "replay", "--all"]):
        done = await semel(settings, *command)
        assert done.code == 0, done.stderr
    exchange = await channel.get_exchange(settings.exchange, ensure=False)
    with pytest.raises(DeliveryError):  # returned: no queue is bound to it
        await exchange.publish(aio_pika.Message(b"{}"), routing_key="users.created", mandatory=True)
    names_of = Topology(settings.queue)
    probe = await connection.channel()
    with pytest.raises(ChannelNotFoundEntity):
        await probe.declare_queue(names_of.tier_queue(1.0), passive=True)
    cleanup = await connection.channel()
    await cleanup.queue_delete(names_of.tier_queue(2.0))  # not among the fixture's names
