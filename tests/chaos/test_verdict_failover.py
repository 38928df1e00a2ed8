"""The failover cause: writes a SIGKILLed Redis primary acknowledged but had not replicated."""

from __future__ import annotations

import pytest

from tests.chaos.ledger import Run
from tests.chaos.verdict import (
    KILLED,
    UNEXPLAINED,
    UNREPLICATED,
    Failover,
    Settled,
    claim_lost,
    duplicates_of,
    judge,
    overlapping,
)
from tests.chaos.workers import Kill

pytestmark = pytest.mark.timeout(10)

T0 = 1_000.0
KILLED_AT = T0 + 10
FAILOVER = Failover(KILLED_AT, KILLED_AT + 2)


def run(fence: int, pid: int, started: float, length: float = 0.02) -> Run:
    return Run("k", fence, 1, pid, started, started + length / 2, started + length, "returned")


def completed(fence: int, pid: int, at: float) -> Settled:
    return Settled("k", fence, "completed", at, pid, 0.05)


def causes(runs: list[Run], settled: list[Settled], kills: list[Kill] | None = None) -> list[str]:
    return [d.cause for d in duplicates_of(runs, settled, kills or [], [], [FAILOVER])]


def test_a_completion_reported_just_before_the_kill_and_run_again_after_it_is_unreplicated() -> (
    None
):
    first = run(1, 10, KILLED_AT - 0.3)
    settled = [completed(1, 10, KILLED_AT - 0.25)]
    assert causes([first, run(2, 11, KILLED_AT + 5)], settled) == [UNREPLICATED]


def test_a_completion_long_before_the_kill_run_again_is_still_unexplained() -> None:
    first = run(1, 10, KILLED_AT - 5)
    settled = [completed(1, 10, KILLED_AT - 4.9)]
    assert causes([first, run(2, 11, KILLED_AT + 5)], settled) == [UNEXPLAINED]


def test_a_completion_just_before_the_kill_run_again_before_it_is_unexplained() -> None:
    # The rerun came before the primary died: the lost write cannot explain it.
    first = run(1, 10, KILLED_AT - 0.9)
    settled = [completed(1, 10, KILLED_AT - 0.85)]
    assert causes([first, run(2, 11, KILLED_AT - 0.5)], settled) == [UNEXPLAINED]


def test_without_a_failover_the_same_rerun_is_unexplained() -> None:
    runs = [run(1, 10, KILLED_AT - 0.3), run(2, 11, KILLED_AT + 5)]
    settled = [completed(1, 10, KILLED_AT - 0.25)]
    assert [d.cause for d in duplicates_of(runs, settled, [], [])] == [UNEXPLAINED]


def test_a_claim_granted_before_the_kill_and_lost_explains_two_executions_at_once() -> None:
    # The new primary never had the claim: another worker claimed the key (the
    # same fence again) and ran it while the first execution still ran.
    first = run(1, 10, KILLED_AT - 0.1, length=3.0)
    second = run(1, 11, KILLED_AT + 2.1)
    [found] = duplicates_of([first, second], [], [], [], [FAILOVER])
    assert found.cause == UNREPLICATED
    assert "claim was not replicated" in found.evidence
    pairs = overlapping([first, second])
    assert len(pairs) == 1
    assert claim_lost(pairs[0], [FAILOVER])


def test_two_executions_at_once_with_the_claim_made_after_the_kill_are_unexplained() -> None:
    first = run(1, 10, KILLED_AT + 3, length=3.0)
    second = run(2, 11, KILLED_AT + 4)
    assert causes([first, second], []) == [UNEXPLAINED]
    assert not claim_lost(overlapping([first, second])[0], [FAILOVER])


def test_a_worker_kill_comes_before_a_failover() -> None:
    runs = [run(1, 10, KILLED_AT - 0.3), run(2, 11, KILLED_AT + 5)]
    assert causes(runs, [], [Kill(10, KILLED_AT - 0.2, 1, True)]) == [KILLED]


def test_unreplicated_writes_fail_a_run_only_when_replicas_acknowledge() -> None:
    runs = [run(1, 10, KILLED_AT - 0.3), run(2, 11, KILLED_AT + 5)]
    duplicates = duplicates_of(runs, [completed(1, 10, KILLED_AT - 0.25)], [], [], [FAILOVER])
    verdict = judge(["k"], {"k"}, {}, duplicates)
    assert verdict.ok
    verdict.replicated = True
    assert not verdict.ok
