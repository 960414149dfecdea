"""The arguments' fingerprint that keeps torchrun processes from pairing different calls of
one line (`twinkle_local.fingerprint`)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from twinkle_local.fingerprint import arguments_print

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=80),
    st.binary(max_size=80),
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=20,
)


@given(values)
def test_equal_arguments_give_equal_prints_in_any_process(value):
    call = [((value,), {"k": value})] * 2
    assert arguments_print(call) == arguments_print(copy.deepcopy(call)) != 0


@given(st.integers(), st.integers())
def test_different_scalars_give_different_prints(a, b):
    if a != b:
        assert arguments_print([((a,), {})]) != arguments_print([((b,), {})])


def test_no_arguments_print_zero_and_arrays_are_read_cheaply():
    assert arguments_print([((), {}), ((), {})]) == 0
    a, b = np.arange(10.0), np.arange(10.0)
    b[-1] = 99
    assert arguments_print([((a,), {})]) != arguments_print([((b,), {})])
    t = torch.zeros(3)  # a tensor: its shape and type only (no device synchronisation)
    assert arguments_print([((t,), {})]) == arguments_print([((torch.ones(3),), {})])
    assert arguments_print([((t,), {})]) != arguments_print([((torch.zeros(4),), {})])
