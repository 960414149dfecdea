"""Packing results for the all-reduce gives what core's sum/mean collectors give on the objects.

The all-reduce itself is a sum of the packed buffers; here the sum is taken locally (one process
packs every value), which is exactly what the buffers add up to across processes.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_core.plugin import MeanCollector, SumCollector
from twinkle_local.numeric import numeric_spec, pack, same_spec, unpack

Pair = namedtuple("Pair", "a b")

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
small_ints = st.integers(min_value=-(10**6), max_value=10**6)


def _leaf(kind: str, shape: tuple[int, ...]):
    n = int(np.prod(shape)) if shape else 1
    if kind == "int":
        return small_ints
    if kind == "float":
        return finite
    if kind.startswith("np_"):
        dtype = np.dtype(kind[3:])
        elems = small_ints if dtype.kind == "i" else finite
        if shape == ():
            return elems.map(lambda x: dtype.type(x))
        return st.lists(elems, min_size=n, max_size=n).map(
            lambda xs: np.asarray(xs, dtype=dtype).reshape(shape)
        )
    dtype = getattr(torch, kind[6:])
    elems = small_ints if not dtype.is_floating_point else finite
    return st.lists(elems, min_size=n, max_size=n).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64).to(dtype).reshape(shape)
    )


KINDS = [
    "int",
    "float",
    "np_float32",
    "np_float64",
    "np_int64",
    "np_int32",
    "torch_float32",
    "torch_float64",
    "torch_int64",
    "torch_int32",
]
shapes = st.sampled_from([(), (3,), (2, 2)])


@st.composite
def result_lists(draw):
    """2-4 results of one structure: a leaf, a dict of leaves, or a namedtuple of them."""
    layout = draw(st.sampled_from(["leaf", "dict", "tuple"]))
    count = draw(st.integers(2, 4))
    if layout == "leaf":
        kind, shape = draw(st.sampled_from(KINDS)), draw(shapes)
        shape = () if kind in ("int", "float") else shape
        return [draw(_leaf(kind, shape)) for _ in range(count)]
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(2)]
    shp = [() if k in ("int", "float") else draw(shapes) for k in kinds]
    if layout == "dict":
        return [
            {"x": draw(_leaf(kinds[0], shp[0])), "y": draw(_leaf(kinds[1], shp[1]))}
            for _ in range(count)
        ]
    return [
        Pair(draw(_leaf(kinds[0], shp[0])), draw(_leaf(kinds[1], shp[1]))) for _ in range(count)
    ]


def assert_same(actual, expected):
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
    elif isinstance(expected, tuple):
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-3)
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert np.asarray(actual).dtype == np.asarray(expected).dtype
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-3)
    else:
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(result_lists(), st.sampled_from(["sum", "mean"]))
def test_pack_unpack_matches_the_collector(values, op):
    spec = numeric_spec(values[0])
    assert spec is not None
    assert all(same_spec(spec, numeric_spec(v)) for v in values)
    collector = SumCollector() if op == "sum" else MeanCollector()
    expected = collector.collect(values, None)
    # Process p packs its own value; the all-reduce adds the buffers up.
    parts = [pack([v], spec) for v in values]
    summed = {k: sum(p[k] for p in parts) for k in parts[0]}
    assert_same(unpack(summed, spec, op, len(values)), expected)


def test_an_idle_process_contributes_zeros():
    spec = numeric_spec({"loss": 1.5, "t": torch.ones(2, dtype=torch.int32)})
    zeros = pack([], spec)
    assert zeros["float64"].tolist() == [0.0] and zeros["int64"].tolist() == [0, 0]


@pytest.mark.parametrize(
    "value",
    [
        True,
        None,
        "text",
        [1.0, 2.0],
        {},
        (),
        np.array([True]),
        torch.tensor([1j]),
        torch.tensor([True]),
        2**70,
        {"a": [1]},
        (1.0, "x"),
    ],
)
def test_non_numbers_are_gathered_instead(value):
    assert numeric_spec(value) is None


def test_specs_must_match_to_reduce_together():
    assert not same_spec(numeric_spec(1.0), numeric_spec(np.float64(1.0)))
    assert not same_spec(numeric_spec(torch.ones(2)), numeric_spec(torch.ones(3)))
    assert not same_spec(numeric_spec({"a": 1}), numeric_spec({"b": 1}))
    assert not same_spec(numeric_spec(Pair(1, 2)), numeric_spec((1, 2)))
    assert same_spec(numeric_spec(torch.ones(2)), numeric_spec(torch.zeros(2)))
