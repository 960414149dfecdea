"""`is_plain_data`, the call path's short road for plain arguments: True only for values with
nothing inside that the walks it replaces would find (a LazyCollect, a process-bound object,
something that does not pickle faithfully), and True for the shapes calls carry."""

from __future__ import annotations

import collections
import pickle
import threading
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from twinkle_core.lazy import LazyCollect
from twinkle_core.plain import MAX_DEPTH, MAX_ITEMS
from twinkle_core.plugin import is_plain_data

_plain_leaves = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.complex_numbers(allow_nan=False),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.none(),
    st.booleans(),
)
_keys = st.one_of(st.text(max_size=2), st.integers(0, 9))


def _containers(inner):
    return st.one_of(
        # Sizes on both sides of the item-by-item look (`plain._LOOP_ITEMS`).
        st.lists(inner, max_size=12),
        st.lists(inner, max_size=12).map(tuple),
        st.dictionaries(_keys, inner, max_size=12),
    )


_plain = st.recursive(_plain_leaves, _containers, max_leaves=25)


def _depth(value: Any) -> int:
    if type(value) is dict:
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if type(value) in (list, tuple):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


class _Sub(dict):
    """A dict subclass: it may carry state of its own, so it is never plain."""


def _foreign() -> list[Any]:
    return [
        LazyCollect.of_value(1),
        threading.Lock(),
        _Sub(a=1),
        collections.OrderedDict(a=1),
        object(),
        {1, 2},
    ]


@given(_plain)
def test_plain_values_within_the_limits_are_plain_and_pickle_faithfully(value):
    assert is_plain_data(value) == (_depth(value) <= MAX_DEPTH)
    if is_plain_data(value):
        assert pickle.loads(pickle.dumps(value)) == value


@given(_plain, st.integers(0, 5), st.data())
def test_anything_foreign_anywhere_makes_it_not_plain(value, which, data):
    """Whatever the walks would look for, put anywhere (an item, or a dict key), and the
    answer is False."""
    foreign = _foreign()[which]
    spots = []

    def collect(v: Any) -> None:
        if type(v) in (list, dict):
            spots.append(v)
            for item in v.values() if type(v) is dict else v:
                collect(item)

    holder = [value]
    collect(holder)
    spot = data.draw(st.sampled_from(spots))
    if type(spot) is dict:
        spot[data.draw(_keys)] = foreign
    else:
        spot.append(foreign)
    assert not is_plain_data(holder)
    if foreign.__hash__ is not None:
        assert not is_plain_data({foreign: 1})  # a foreign key too


def test_the_shapes_calls_carry_are_plain_and_large_ones_are_left_to_the_walks():
    config = {"step": 3, "lr": 1e-4, "tags": ["a", "b"], "sizes": (1, 2), "name": None}
    assert is_plain_data((config,)) and is_plain_data({"ids": list(range(MAX_ITEMS))})
    assert not is_plain_data(list(range(MAX_ITEMS + 1)))  # not looked into: the walks decide
    assert not is_plain_data({str(i): i for i in range(MAX_ITEMS + 1)})
    assert not is_plain_data([[[[1]]]])  # deeper than MAX_DEPTH
    assert is_plain_data([[[1]]])
    assert not is_plain_data(True.__class__)  # a type is not data


_numeric_dtypes = st.sampled_from(
    [np.float32, np.float64, np.int64, np.uint8, np.bool_, np.complex64, "U3", "S2"]
)


@given(
    st.lists(hnp.arrays(_numeric_dtypes, hnp.array_shapes(max_dims=2, max_side=4)), max_size=12),
    st.integers(0, 2),
)
def test_numpy_arrays_without_python_objects_are_plain_leaves_at_any_depth(arrays, nest):
    """A numpy array whose dtype holds no Python objects is a leaf (no LazyCollect, nothing
    process-bound, and it pickles faithfully), alone, in a container, or at the deepest level
    a container may be; an array of Python objects, or a subclass of ndarray, is not."""
    value: Any = arrays
    for _ in range(nest):
        value = {"batch": value}
    assert is_plain_data(value)
    assert is_plain_data(tuple(arrays))
    for array in arrays:
        assert is_plain_data(array)
        again = pickle.loads(pickle.dumps(array))
        assert again.dtype == array.dtype and again.shape == array.shape
        assert np.array_equal(again, array, equal_nan=array.dtype.kind in "fc")
    deepest: Any = arrays[:1] or [np.zeros(2)]
    for _ in range(MAX_DEPTH - 1):
        deepest = [deepest]
    assert is_plain_data(deepest)  # arrays in the deepest container allowed
    foreign = [
        np.array([threading.Lock(), 1], dtype=object),
        np.array([LazyCollect.of_value(1)], dtype=object),
        np.ma.masked_array([1.0, 2.0]),
        np.array([(1, None)], dtype=[("a", "i4"), ("b", "O")]),
    ]
    for bad in foreign:
        assert not is_plain_data(bad)
        assert not is_plain_data({"batch": [*arrays, bad]})
        assert not is_plain_data((bad, *arrays))
