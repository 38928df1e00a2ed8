"""The store contract, run against the PostgreSQL store in transactional mode
(this package's ``make_store``), plus its race of many claimers per key."""

from __future__ import annotations

import pytest

from tests.conftest import SettingsFactory
from tests.stores.race import assert_one_winner_per_key
from tests.stores.test_contract import (
    test_completion_resets_nothing_but_retention_forgets,
    test_first_claim_then_duplicate_returns_stored_result,
    test_heartbeat_keeps_lease_past_ttl,
    test_lease_expiry_takeover_fences_out_old_owner,
    test_migrate_is_idempotent,
    test_mismatch_writes_nothing,
    test_poison_after_max_claims,
    test_release_lets_next_claim_in_with_higher_fence,
    test_reset_lets_failed_key_run_again,
    test_terminal_failure_is_remembered,
)

pytestmark = pytest.mark.timeout(60)

__all__ = [
    "test_completion_resets_nothing_but_retention_forgets",
    "test_first_claim_then_duplicate_returns_stored_result",
    "test_heartbeat_keeps_lease_past_ttl",
    "test_lease_expiry_takeover_fences_out_old_owner",
    "test_migrate_is_idempotent",
    "test_mismatch_writes_nothing",
    "test_poison_after_max_claims",
    "test_release_lets_next_claim_in_with_higher_fence",
    "test_reset_lets_failed_key_run_again",
    "test_terminal_failure_is_remembered",
]


async def test_race_one_winner_per_key(make_settings_tx: SettingsFactory, tables: None) -> None:
    await assert_one_winner_per_key(make_settings_tx())
