"""``semel dlq replay --all`` with a consumer running: a poison key's handler runs once.

A poison key has one dead letter per later copy. Replaying them all resets
the key once per letter; a reset that reopened the completed key (or ended
the running copy's lease) ran the handler a second time.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer.broker import topology
from semel.consumer.broker.topology import queue_specs
from semel.consumer.delivery.message import fingerprint
from semel.consumer.names import Reason, Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.stores.base import Outcome, Store
from tests.conftest import Rabbitmqctl, SettingsFactory, open_store
from tests.consumer.conftest import FAST
from tests.consumer.handlers import LEDGER_ENV, read_ledger
from tests.consumer.harness import Broker, InProcessConsumer
from tests.tools.conftest import dead_letter, eventually, semel, wait_for_depth

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis", "dynamodb-moto"]),
]

POISON_KEY = "poisoned"
BETWEEN = 300  # dead letters of other keys between the poison key's two


@pytest.fixture
def settings(make_settings: SettingsFactory, rabbitmq_server: str) -> Settings:
    """A consumer's settings (the fast ones of the consumer tests) on a private topology."""
    run = uuid.uuid4().hex[:10]
    private = {"amqp_url": rabbitmq_server, "queue": f"t.replay.{run}", "exchange": f"t.{run}.ev"}
    return make_settings(**(FAST | private))


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    opened = await open_store(settings)
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path


async def poisoned(store: Store, key: str, body: dict[str, object]) -> None:
    """The key as the consumer leaves it after ``max_claims`` crashed runs and one more copy."""
    fp = fingerprint(body)
    for _ in range(store.config.max_claims):
        claim = await store.claim(key, fp)
        assert claim.outcome is Outcome.CLAIMED
        assert await store.release(key, claim.fence)
    assert (await store.claim(key, fp)).outcome is Outcome.POISON


async def held(rabbitmqctl: Rabbitmqctl, settings: Settings) -> int:
    """Messages in the topology's queues (work, retry, conflict, DLQ), ready and
    unacknowledged: 0 once every delivery is settled and none is parked."""
    out = await rabbitmqctl("list_queues", "-q", "--no-table-headers", "name", "messages")
    counts = dict(line.split("\t") for line in out.splitlines() if "\t" in line)
    return sum(int(counts[spec.name]) for spec in queue_specs(topology_of(settings)))


async def test_replaying_every_letter_of_a_poison_key_runs_it_once(
    settings: Settings,
    connection: AbstractConnection,
    channel: AbstractChannel,
    store: Store,
    ledger: Path,
    rabbitmqctl: Rabbitmqctl,
) -> None:
    await topology.declare(connection, topology_of(settings))
    body = {"event": "order.paid", "order_id": POISON_KEY, "amount": 1}  # dead_letter's body
    await poisoned(store, POISON_KEY, body)
    others = [f"other-{i}" for i in range(BETWEEN)]
    await dead_letter(channel, settings, POISON_KEY, Reason.POISON)
    for key in others:
        await dead_letter(channel, settings, key, Reason.PERMANENT_ERROR)
    await dead_letter(channel, settings, POISON_KEY, Reason.POISON)
    await wait_for_depth(channel, Topology(settings.queue).dead_letter_queue, BETWEEN + 2)

    broker = Broker(connection, channel)
    consumer = await InProcessConsumer(settings).start(broker, settings)
    try:
        done = await semel(settings, "dlq", "replay", "--all")
        assert done.code == 0, done.stderr
        assert done.stdout.strip() == f"replayed {BETWEEN + 2}, kept 0"

        def ended() -> set[str]:
            return {run["key"] for run in read_ledger(ledger) if run["event"] == "end"}

        async def settled() -> bool:
            # Every copy ran or was answered, the poison key's second copy included.
            return ended() >= {POISON_KEY, *others} and await held(rabbitmqctl, settings) == 0

        await eventually(settled, deadline=60)
    finally:
        assert await consumer.finish() == 0
    runs = [run for run in read_ledger(ledger) if run["key"] == POISON_KEY]
    assert [run["event"] for run in runs] == ["start", "end"], "the poison key ran again"
    assert (await store.claim(POISON_KEY, fingerprint(body))).outcome is Outcome.DUPLICATE
