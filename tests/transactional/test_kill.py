"""The proof: consumer processes SIGKILLed at every step of a transactional
delivery, many times over, still leave exactly one business row and exactly one
outgoing message per key, and lose none."""

from __future__ import annotations

from pathlib import Path

import pytest

from semel.consumer.names import Topology
from semel.stores.postgres.transactional import TransactionalStore
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import Broker
from tests.transactional.conftest import Downstream
from tests.transactional.handlers import KILL_POINTS
from tests.transactional.killing import Plan, fail_unless_exactly_once, run_rounds

pytestmark = pytest.mark.timeout(180)

KILLS_PER_STEP = 3
KEYS_PER_ROUND = 4  # 5 steps x 3 kills x 4 keys = 60 keys


async def test_killed_at_every_step_every_key_has_one_row_and_one_message(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    downstream: Downstream,
    business_table: str,
    tmp_path: Path,
) -> None:
    settings = consumer_settings_tx(max_claims=100)  # kills are not poison here
    plan = Plan(KILL_POINTS, KILLS_PER_STEP, KEYS_PER_ROUND, business_table)
    store = await open_store(settings)
    assert isinstance(store, TransactionalStore)
    try:
        report = await run_rounds(plan, settings, broker, downstream, store, tmp_path / "log")
    finally:
        await store.close()
    print(report.summary())
    assert report.kills == dict.fromkeys(KILL_POINTS, KILLS_PER_STEP)
    assert report.keys >= 40
    fail_unless_exactly_once(report, report.keys)
    assert await broker.depth(Topology(settings.queue).dead_letter_queue) == 0


async def test_the_proof_catches_a_write_outside_the_transaction(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    downstream: Downstream,
    business_table: str,
    tmp_path: Path,
) -> None:
    settings = consumer_settings_tx(
        max_claims=100, handler="tests.transactional.handlers:record_order_outside"
    )
    plan = Plan(("in-handler",), 2, KEYS_PER_ROUND, business_table)
    store = await open_store(settings)
    assert isinstance(store, TransactionalStore)
    try:
        report = await run_rounds(plan, settings, broker, downstream, store, tmp_path / "log")
    finally:
        await store.close()
    doubled = [key for key, rows in report.rows_per_key.items() if rows > 1]
    assert doubled, (
        f"a kill after a write outside the transaction left no trace: {report.summary()}"
    )
    with pytest.raises(pytest.fail.Exception):
        fail_unless_exactly_once(report, report.keys)
