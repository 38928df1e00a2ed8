"""The chaos run's bookkeeping, without servers: the plan and every cause of a duplicate."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.ledger import Run
from tests.chaos.producer import plan
from tests.chaos.verdict import (
    KILLED,
    OUTAGE,
    UNEXPLAINED,
    Settled,
    Window,
    duplicates_of,
    held_through,
    judge,
    overlapping,
    read_settled,
)
from tests.chaos.workers import Kill

pytestmark = pytest.mark.timeout(10)

T0 = 1_000.0
OUTAGE_WINDOW = (T0 + 10, T0 + 16)


def run(fence: int, pid: int, started: float, effect: float | None = None) -> Run:
    effect = started + 0.01 if effect is None else effect
    return Run("k", fence, 1, pid, started, effect, effect + 0.01, "returned")


def settle(fence: int, pid: int, outcome: str, at: float, duration: float) -> Settled:
    return Settled("k", fence, outcome, at, pid, duration)


def causes(runs: list[Run], settled: list[Settled], kills: list[Kill]) -> list[str]:
    return [d.cause for d in duplicates_of(runs, settled, kills, [OUTAGE_WINDOW])]


def test_plan_sends_the_asked_share_of_duplicates_half_concurrent_half_late() -> None:
    orders = plan(1000, 0.4, "r", random.Random(3))
    assert len(orders) == 600
    assert len({o.key for o in orders}) == 600
    assert sum(o.copies for o in orders) == 200
    assert sum(o.late for o in orders) == 200
    assert any(o.body.get("fail") == "permanent" for o in orders)
    assert plan(1000, 0.4, "r", random.Random(3)) == orders  # a seed replays a run


def test_a_single_effect_is_no_duplicate() -> None:
    assert causes([run(1, 10, T0)], [], []) == []


def test_an_effect_cut_short_by_a_kill_after_it_is_explained() -> None:
    runs = [run(1, 10, T0), run(2, 11, T0 + 3)]
    assert causes(runs, [], [Kill(10, T0 + 0.5, 1, True)]) == [KILLED]


def test_a_kill_before_the_effect_explains_nothing() -> None:
    runs = [run(1, 10, T0 + 1), run(2, 11, T0 + 3)]
    assert causes(runs, [], [Kill(10, T0 + 0.5, 1, True)]) == [UNEXPLAINED]


def test_a_rerun_without_kill_or_outage_is_unexplained() -> None:
    assert causes([run(1, 10, T0), run(2, 10, T0 + 3)], [], []) == [UNEXPLAINED]


def test_two_effects_under_one_fence_are_unexplained_even_with_a_kill() -> None:
    runs = [run(1, 10, T0), run(1, 11, T0 + 3)]
    assert causes(runs, [], [Kill(10, T0 + 0.5, 1, True)]) == [UNEXPLAINED]


def test_a_completed_delivery_run_again_is_unexplained_even_if_killed_later() -> None:
    runs = [run(1, 10, T0), run(2, 11, T0 + 3)]
    settled = [settle(1, 10, "completed-ack-lost", T0 + 0.1, 0.1)]
    assert causes(runs, settled, [Kill(10, T0 + 1, 1, True)]) == [UNEXPLAINED]


def test_a_delivery_handed_back_during_the_store_outage_has_its_own_cause() -> None:
    runs = [run(1, 10, T0 + 9), run(2, 11, T0 + 17)]
    settled = [settle(1, 10, "store-unavailable", T0 + 10.6, 1.6)]
    assert causes(runs, settled, []) == [OUTAGE]


def test_a_delivery_handed_back_with_no_outage_is_unexplained() -> None:
    runs = [run(1, 10, T0), run(2, 11, T0 + 3)]
    settled = [settle(1, 10, "store-unavailable", T0 + 1.6, 1.6)]
    assert causes(runs, settled, []) == [UNEXPLAINED]


def test_a_concurrent_copy_meeting_the_execution_is_not_its_settle() -> None:
    runs = [run(1, 10, T0), run(2, 11, T0 + 3)]
    settled = [settle(1, 10, "in-progress", T0 + 0.02, 0.03)]
    assert causes(runs, settled, [Kill(10, T0 + 0.5, 1, True)]) == [KILLED]


def test_lost_keys_are_those_neither_completed_nor_dead_lettered() -> None:
    verdict = judge(["a", "b", "c", "d"], {"a"}, {"b": {"permanent-error"}}, [])
    assert sorted(verdict.lost) == ["c", "d"]
    assert verdict.dead_lettered == {"permanent-error": 1}
    assert not verdict.ok
    assert judge(["a"], {"a"}, {}, []).ok


def test_settle_lines_are_read_from_json_logs_and_cut_lines_skipped(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(
        '{"key": "k", "fence": 2, "outcome": "completed", "duration_ms": 250.0,'
        ' "event": "settled", "timestamp": "2026-01-01T00:00:01.500000Z"}\n'
        '{"event": "consuming", "timestamp": "2026-01-01T00:00:00Z"}\n'
        '{"key": "k", "fence": 3, "outcome": "sett'
    )
    [found] = read_settled({42: log})
    assert (found.key, found.fence, found.outcome, found.pid) == ("k", 2, "completed", 42)
    assert found.duration == pytest.approx(0.25)
    assert found.at == pytest.approx(1767225601.5)


def test_a_completion_is_held_through_an_outage_only_if_it_spans_the_window() -> None:
    start, end = OUTAGE_WINDOW
    spanning = settle(1, 10, "completed", end - 0.2, end - 0.2 - (start - 1))
    quick = settle(1, 11, "completed", start + 0.3, 0.5)  # done as the store went away
    inside = settle(1, 12, "completed", end - 1, 1.0)  # arrived during the outage
    handed_back = settle(1, 13, "store-unavailable", end + 0.5, end + 0.5 - (start - 1))
    assert held_through([spanning, quick, inside, handed_back], [OUTAGE_WINDOW]) == 1


def test_an_execution_running_alongside_the_next_is_unexplained_even_in_an_outage() -> None:
    # A worker cut off from the store ran on while another claimed the key:
    # handing the delivery back in the outage does not explain two at once.
    first = Run("k", 1, 1, 10, T0 + 9, T0 + 15, T0 + 15.1, "returned")
    second = run(2, 11, T0 + 14, effect=T0 + 15.5)
    settled = [settle(1, 10, "fenced-out", T0 + 16.5, 7.5)]
    [found] = duplicates_of([first, second], settled, [], [OUTAGE_WINDOW])
    assert found.cause == UNEXPLAINED
    assert "at the same time as pid 11 fence 2" in found.evidence


def test_an_execution_without_an_effect_running_alongside_is_an_overlap_too() -> None:
    first = Run("k", 1, 1, 10, T0, T0 + 0.1, T0 + 0.2, "returned")
    cancelled = Run("k", 2, 1, 11, T0 + 0.05, None, T0 + 0.3, "cancelled")
    last = run(3, 12, T0 + 5)
    causes_found = causes([first, cancelled, last], [], [Kill(10, T0 + 1, 1, True)])
    assert causes_found == [UNEXPLAINED]


def test_a_window_of_one_process_explains_only_its_handing_back() -> None:
    runs = [run(1, 10, T0 + 9), run(2, 11, T0 + 17)]
    settled = [settle(1, 10, "store-unavailable", T0 + 10.6, 1.6)]
    mine = Window(*OUTAGE_WINDOW, frozenset({10}))
    other = Window(*OUTAGE_WINDOW, frozenset({11}))
    assert [d.cause for d in duplicates_of(runs, settled, [], [mine])] == [OUTAGE]
    assert [d.cause for d in duplicates_of(runs, settled, [], [other])] == [UNEXPLAINED]


def test_a_key_meant_to_complete_found_only_in_the_dlq_is_parked() -> None:
    dead = {"b": {"permanent-error"}, "c": {"poison"}, "d": {"poison"}}
    verdict = judge(["a", "b", "c", "d"], {"a", "d"}, dead, [], failing={"b"})
    assert verdict.parked == ["c"]  # d's dead letter was a copy: the key completed
    assert verdict.lost == []
    assert not verdict.ok


def test_overlapping_executions_are_counted_with_or_without_an_effect() -> None:
    stalled = Run("k", 1, 1, 10, T0, None, T0 + 6, "cancelled")
    meanwhile = run(2, 11, T0 + 3)
    after = run(3, 12, T0 + 7)
    assert overlapping([after, meanwhile, stalled]) == [(stalled, meanwhile)]
