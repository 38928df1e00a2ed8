"""How a result is written: the JSON form of values JSON has no word for (pure)."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID

import orjson
import pytest

from semel.stores.codec import dump_result, load_result

pytestmark = pytest.mark.timeout(10)


def test_a_set_is_a_sorted_list_when_its_items_sort_and_a_list_otherwise() -> None:
    assert load_result(dump_result({3, 1, 2})) == [1, 2, 3]
    assert sorted(load_result(dump_result({1, "a"})), key=str) == [1, "a"]


def test_keys_that_are_not_strings_become_strings() -> None:
    key = UUID(int=1)
    assert load_result(dump_result({1: "a", key: Decimal("0.10")})) == {"1": "a", str(key): "0.10"}


def test_a_value_with_no_json_form_is_refused() -> None:
    with pytest.raises(orjson.JSONEncodeError):
        dump_result({"when": object()})
    with pytest.raises(orjson.JSONEncodeError):
        dump_result(2**70)  # past 64 bits
