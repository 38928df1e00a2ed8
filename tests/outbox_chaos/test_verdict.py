"""The outbox chaos verdict on hand-made outcomes: each way to break the promise is caught."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.verdict import KILLED, UNEXPLAINED, Duplicate
from tests.outbox_chaos.driver import Answer
from tests.outbox_chaos.verdict import Copy, OutboxRow, Verdict, judge

pytestmark = pytest.mark.timeout(10)

ORDERS = {"a": "id-a", "b": "id-b"}
OUTBOX = [OutboxRow("a", "id-a", True), OutboxRow("b", "id-b", True)]
TAP = [Copy("a", "id-a"), Copy("b", "id-b"), Copy("b", "id-b")]  # b re-sent by a relay
CONSUMED = {"a": {"id-a"}, "b": {"id-b"}}
ANSWERS = {"a": [Answer(201, "id-a"), Answer(200, "id-a")], "b": [Answer(201, "id-b")],
           "f": [Answer(500, None)]}  # fmt: skip


def verdict(**changes: Any) -> Verdict:
    given: dict[str, Any] = {
        "orders": ORDERS,
        "failing": {"f"},
        "outbox": OUTBOX,
        "tap": TAP,
        "consumed": CONSUMED,
        "answers": ANSWERS,
        "completed": {"a", "b"},
        "duplicates": [],
    }
    return judge(**(given | changes))


def test_a_clean_run_passes_and_counts_a_resent_copy_once() -> None:
    found = verdict()
    assert found.ok
    assert (found.committed, found.rolled_back, found.published, found.copies) == (2, 1, 2, 3)


def test_a_committed_order_never_published_is_lost() -> None:
    found = verdict(tap=[Copy("a", "id-a")])
    assert found.lost == ["b"]
    assert not found.ok


def test_a_key_under_a_second_message_id_is_caught_wherever_it_shows() -> None:
    assert verdict(tap=[*TAP, Copy("a", "id-a2")]).wrong_id == ["a"]
    assert verdict(consumed={"a": {"id-a", "x"}, "b": {"id-b"}}).wrong_id == ["a"]
    assert verdict(answers=ANSWERS | {"b": [Answer(200, "other")]}).wrong_id == ["b"]
    assert verdict(outbox=[*OUTBOX, OutboxRow("a", "id-a3", True)]).wrong_id == ["a"]


def test_a_rolled_back_order_published_or_staged_fails_the_run() -> None:
    published = verdict(tap=[*TAP, Copy("f", "id-f")])
    assert published.rolled_back_published == ["f"]
    staged = verdict(outbox=[*OUTBOX, OutboxRow("f", "id-f", False)])
    assert staged.staged_without_order == ["f"]
    assert staged.unsent == 1
    assert not published.ok
    assert not staged.ok


def test_an_answer_without_its_order_row_and_an_unconsumed_order_fail_the_run() -> None:
    answered = verdict(answers=ANSWERS | {"c": [Answer(201, "id-c")]})
    assert answered.answered_not_committed == ["c"]
    assert verdict(completed={"a"}).not_consumed == ["b"]


def test_only_an_unexplained_duplicate_effect_fails_the_run() -> None:
    killed = Duplicate("a", 1, 10, KILLED, "SIGKILLed after the effect", True)
    assert verdict(duplicates=[killed]).ok
    odd = Duplicate("a", 1, 10, UNEXPLAINED, "two effects under fence 1", True)
    assert not verdict(duplicates=[odd]).ok
