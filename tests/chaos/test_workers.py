"""The worker pool's kills, before any worker has run a handler."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.workers import Pool

pytestmark = pytest.mark.timeout(10)


async def test_a_kill_before_any_handler_ran_finds_none_and_does_not_fail(tmp_path: Path) -> None:
    # The first kill of a run that started slowly under load came before any
    # worker had written the ledger, and the read-only open of it failed.
    pool = Pool(0, {}, tmp_path / "logs", tmp_path / "ledger.db")
    assert await pool.kill_mid_handler(random.Random(7), after_effect=True, deadline=0.2) is None
