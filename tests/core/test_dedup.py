from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkeos.core.dedup import SeenIds
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.idempotent import key_of, positional_keys
from sparkeos.testing.inprocess import MemoryStore


def test_redeliveries_are_dropped_until_acknowledged():
    seen = SeenIds()
    seen.add(0, ["a", "b"])
    assert seen.filter_new(["a", "c", "c", "b", "d"]) == ["c", "d"]
    seen.add(1, ["c", "d"])
    assert seen.acknowledged(0) == 2
    assert "a" not in seen and "c" in seen and len(seen) == 2


def test_bound_is_an_error_not_silent_forgetting():
    seen = SeenIds(max_ids=3)
    seen.add(0, ["a", "b"])
    with pytest.raises(ConfigurationError, match="bound of 3"):
        seen.add(1, ["c", "d"])
    assert len(seen) == 2


def test_persisted_with_the_batch_and_restored():
    store = MemoryStore()
    seen = SeenIds()
    seen.add(4, ["x"])
    seen.save(store, 4)
    seen.add(5, ["y"])
    seen.save(store, 5)
    assert [n for n in store.list_names()] == ["seen-ids.00000000000000000005.json"]
    restored = SeenIds.load(store)
    assert "x" in restored and "y" in restored
    assert len(SeenIds.load(store, at_most_batch=4)) == 0  # older snapshot was dropped
    assert len(SeenIds.load(MemoryStore())) == 0


def test_stable_keys():
    assert key_of(["a", 1]) == key_of(["a", 1]) != key_of(["a", 2])
    assert key_of([None, "x"]) != key_of(["", "x"])


def test_keys_are_unambiguous():
    """Issue 8, defect 4: a separator inside a value, or a value equal to the old null
    marker, made different rows share a key."""
    assert key_of(["a\x1fb", "c"]) != key_of(["a", "b\x1fc"])
    assert key_of([None]) != key_of(["\x00"]) and key_of([None]) != key_of(["N"])
    assert key_of(["1:a"]) != key_of([1, "a"]) and key_of(["", ""]) != key_of([""])
    assert key_of([True]) == key_of(["true"])  # Spark's text of a boolean


@given(st.lists(st.lists(st.one_of(st.none(), st.text(max_size=4), st.integers(),
                                   st.booleans()), max_size=3), min_size=2, max_size=2,
                unique_by=lambda row: tuple(key_text_or_none(v) for v in row)))
def test_distinct_rows_have_distinct_keys(rows):
    first, second = rows
    if [key_text_or_none(v) for v in first] != [key_text_or_none(v) for v in second]:
        assert key_of(first) != key_of(second)


def key_text_or_none(value):  # type: ignore[no-untyped-def]
    from sparkeos.core.idempotent import key_text

    return None if value is None else key_text(value)
    assert list(positional_keys(3, 1, 10, 2)) == ["3-1-10", "3-1-11"]
