"""The one back-off: doubling pauses with jitter, as a pure function of the attempt."""

from __future__ import annotations

import pytest

from semel.consumer.backoff import Backoff, pause

pytestmark = pytest.mark.timeout(10)


def test_the_pause_doubles_up_to_the_longest_and_lies_in_its_upper_half() -> None:
    for attempt, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.0, 1.0]):
        assert pause(attempt, 0.1, 1.0, 0.0) == pytest.approx(ceiling / 2)
        assert pause(attempt, 0.1, 1.0, 1.0) == pytest.approx(ceiling)
        assert pause(attempt, 0.1, 1.0, 0.5) == pytest.approx(ceiling * 0.75)


def test_a_huge_attempt_count_stays_at_the_longest() -> None:
    assert pause(10_000, 0.05, 1.0, 1.0) == 1.0


def test_two_backoffs_drawing_different_numbers_part_ways() -> None:
    # Completions that failed together must not retry together, in lockstep.
    draws = iter([0.0, 1.0, 0.0, 1.0])
    first = Backoff(0.1, 1.0, random=lambda: next(draws))
    second = Backoff(0.1, 1.0, random=lambda: next(draws))
    assert first.next() == pytest.approx(0.05)
    assert second.next() == pytest.approx(0.1)


def test_reset_starts_over_from_the_first_pause() -> None:
    backoff = Backoff(0.1, 1.0, random=lambda: 1.0)
    assert [backoff.next() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.4])
    backoff.reset()
    assert backoff.next() == pytest.approx(0.1)
