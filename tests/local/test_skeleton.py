"""`twinkle_local.skeleton`: a result split into its tensors and a skeleton, and filled back.

Both backends' transports use it (torchrun broadcasts, Ray's point-to-point sends and Ray
Direct Transport), so what it accepts and how it rebuilds is checked here once, on random
nested results.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from twinkle_local.skeleton import NotTensors, Slot, fill, split, why_not_carried

plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=16),
)
tensors = st.builds(
    lambda n, dtype: torch.arange(n, dtype=dtype),
    st.integers(0, 6),
    st.sampled_from([torch.float32, torch.int64, torch.float64]),
)
results = st.recursive(
    st.one_of(plain, tensors),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
        st.dictionaries(st.text(max_size=4), inner, max_size=4).map(OrderedDict),
    ),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equal with the same container types all the way down; tensors are the same objects."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def leaves(value) -> list:
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in leaves(v)]
    return [value] if isinstance(value, torch.Tensor) else []


@given(results)
def test_fill_rebuilds_what_split_took_apart_with_the_tensors_in_slot_order(value):
    found: list = []
    skeleton = split(value, found)
    assert [id(t) for t in found] == [id(t) for t in leaves(value)]
    assert not leaves(skeleton)  # no tensor is left in the skeleton
    rebuilt = fill(pickle.loads(pickle.dumps(skeleton)), found)  # the skeleton travels pickled
    assert same(rebuilt, value)


@given(results)
def test_received_tensors_go_where_the_slots_say(value):
    found: list = []
    skeleton = split(value, found)
    received = [t.clone() for t in found]
    rebuilt_leaves = leaves(fill(skeleton, received))
    assert [id(t) for t in rebuilt_leaves] == [id(t) for t in received]


@pytest.mark.parametrize(
    "value, what",
    [
        ({"w": torch.ones(2, requires_grad=True)}, "require grad"),
        ([torch.ones(2).to_sparse()], "sparse"),
        ({"a": np.ones(3)}, "ndarray"),
        ((torch.ones(1), b"x" * 2048), "bytes"),
        ({"p": torch.nn.Parameter(torch.ones(1))}, "Parameter"),
        ({1, 2}, "set"),
    ],
)
def test_what_a_skeleton_cannot_stand_for_is_named(value, what):
    with pytest.raises(NotTensors, match=what):
        split(value, [])


def test_slots_pickle_by_index():
    slot = pickle.loads(pickle.dumps(Slot(3)))
    assert type(slot) is Slot and slot.index == 3


def test_why_a_named_transport_was_not_used_says_what_the_result_holds():
    with pytest.raises(NotTensors) as caught:
        split({"w": torch.ones(2, requires_grad=True)}, [])
    why = why_not_carried("gloo", caught.value)
    assert why.startswith("transport 'gloo' moves torch tensors") and "require grad" in why
    assert why_not_carried("nccl").endswith("this result holds no tensors")
    assert why_not_carried("auto", caught.value) is None  # `auto` named nothing: no log line
