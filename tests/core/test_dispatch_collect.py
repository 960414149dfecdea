"""Built-in dispatchers and collectors, with property tests for the data shaping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from twinkle_core import ConfigurationError, DeviceMesh
from twinkle_core.collect import BUILTIN_COLLECTORS as C
from twinkle_core.dispatch import BUILTIN_DISPATCHERS as D


def test_all_gives_everyone_everything():
    out = D["all"].dispatch((1, [2, 3]), {"k": "v"}, 3, DeviceMesh.from_sizes(dp_size=3))
    assert out == [((1, [2, 3]), {"k": "v"})] * 3


def test_slice_splits_lists_and_copies_the_rest():
    out = D["slice"].dispatch(([1, 2, 3], 7), {"xs": [9, 8, 6], "s": "abc"}, 2, None)
    assert out[0] == (([1, 2], 7), {"xs": [9, 8], "s": "abc"})
    assert out[1] == (([3], 7), {"xs": [6], "s": "abc"})


_NOT_LISTS = st.one_of(
    st.integers(),
    st.text(max_size=4),
    st.tuples(st.integers(), st.integers()),
    st.dictionaries(st.text(max_size=3), st.lists(st.integers(), max_size=3), max_size=3),
    hnp.arrays(np.float32, st.integers(0, 4)),
)


@given(
    args=st.lists(_NOT_LISTS, max_size=4),
    kwargs=st.dictionaries(st.text(max_size=3), _NOT_LISTS, max_size=3),
    n=st.integers(1, 5),
)
def test_slice_with_no_list_to_split_hands_every_worker_the_arguments_as_given(args, kwargs, n):
    """Nothing at the top level is a list (dicts holding lists included: `slice` splits only
    top-level lists): every worker gets the very args tuple (which tells a backend it is the
    one core already found plain data) and the same keyword values. Not for a list in the
    keywords: that one is split."""
    args = tuple(args)
    out = D["slice"].dispatch(args, kwargs, n, None)
    assert len(out) == n
    for worker_args, worker_kwargs in out:
        assert worker_args is args
        assert worker_kwargs.keys() == kwargs.keys()
        assert all(worker_kwargs[k] is kwargs[k] for k in kwargs)
    split = D["slice"].dispatch(args, {**kwargs, "batch": list(range(n))}, n, None)
    assert [k["batch"] for _, k in split] == [[i] for i in range(n)]


@given(
    la=st.integers(0, 12),
    lb=st.integers(0, 12),
    n=st.integers(1, 4),
    dispatcher=st.sampled_from(["slice", "slice_dp"]),
    as_dict=st.booleans(),
)
def test_lists_split_together_must_line_up(la, lb, n, dispatcher, as_dict):
    """Shares of values split together line up item for item, or the call is refused."""
    a, b = list(range(la)), [1000 + i for i in range(lb)]
    mesh = DeviceMesh.from_sizes(dp_size=n)
    kwargs = {"batch": {"x": a, "y": b}} if as_dict and dispatcher == "slice_dp" else {"y": b}
    args = () if "batch" in kwargs else (a,)
    if len(a) != len(b):
        with pytest.raises(ConfigurationError, match="must have the same length"):
            D[dispatcher].dispatch(args, kwargs, n, mesh)
        return
    if dispatcher == "slice_dp" and len(a) < n:
        return  # too small a batch: its own error, tested elsewhere
    shares = D[dispatcher].dispatch(args, kwargs, n, mesh)
    for share_args, share_kwargs in shares:
        if "batch" in share_kwargs:
            xs, ys = share_kwargs["batch"]["x"], share_kwargs["batch"]["y"]
        else:
            xs, ys = share_args[0], share_kwargs["y"]
        assert ys == [x + 1000 for x in xs]


@given(items=st.lists(st.integers()), n=st.integers(1, 8))
def test_slice_then_flatten_gives_the_list_back(items, n):
    shares = D["slice"].dispatch((items,), {}, n, None)
    results = [args[0] for args, _ in shares]
    assert C["flatten"].collect(results, DeviceMesh.from_sizes(dp_size=n)) == items


@given(
    batch=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 40), st.integers(1, 3)),
        elements=st.floats(-1e6, 1e6),
    ),
    dp=st.integers(1, 6),
    tp=st.integers(1, 3),
)
def test_slice_dp_then_concat_gives_the_batch_back(batch, dp, tp):
    mesh = DeviceMesh.from_sizes(dp_size=dp, tp_size=tp)
    if len(batch) < dp:
        with pytest.raises(ConfigurationError, match="data shards"):
            D["slice_dp"].dispatch((batch,), {}, mesh.world_size, mesh)
        return
    shares = D["slice_dp"].dispatch((batch,), {"meta": {"x": batch}}, mesh.world_size, mesh)
    results = [args[0] for args, _ in shares]
    np.testing.assert_array_equal(C["concat"].collect(results, mesh), batch)
    # tp peers receive the very same shard object (a backend serializes it once)
    for rank in range(mesh.world_size):
        peer_first = mesh.ranks.index(rank - rank % tp)
        assert shares[rank] is shares[peer_first]
        np.testing.assert_array_equal(shares[rank][1]["meta"]["x"], shares[rank][0][0])


@given(items=st.lists(st.integers(), min_size=1), dp=st.integers(1, 5))
def test_slice_dp_lists_tuples_and_dicts(items, dp):
    mesh = DeviceMesh.from_sizes(dp_size=dp)
    if len(items) < dp:
        return
    shares = D["slice_dp"].dispatch(({"a": items, "b": tuple(items)}, "label"), {}, dp, mesh)
    assert C["flatten"].collect([s[0][0]["a"] for s in shares], mesh) == items
    assert sum((s[0][0]["b"] for s in shares), ()) == tuple(items)
    assert all(s[0][1] == "label" for s in shares)


def test_slice_dp_too_small_batch_is_a_clear_error():
    mesh = DeviceMesh.from_sizes(dp_size=4)
    with pytest.raises(ConfigurationError, match=r"argument 'batch' has 2 items .* 4 data shards"):
        D["slice_dp"].dispatch((), {"batch": [1, 2]}, 4, mesh)


def test_slice_dp_mesh_must_match_workers():
    with pytest.raises(ConfigurationError, match="device mesh has 2 ranks"):
        D["slice_dp"].dispatch(([1, 2, 3],), {}, 3, DeviceMesh.from_sizes(dp_size=2))


def test_collectors_basic():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    results = [1.0, 1.0, 3.0, 3.0]  # tp peers agree
    assert C["none"].collect(results, mesh) == results
    assert C["first"].collect(results, mesh) == 1.0
    assert C["mean"].collect(results, mesh) == 2.0
    assert C["sum"].collect(results, mesh) == 4.0
    assert C["flatten"].collect([[1], [1], [2, 3], [2, 3]], mesh) == [1, 2, 3]


def test_last_pp_returns_last_stage_results():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2)
    assert C["last_pp"].collect(["a", "b", "c", "d"], mesh) == ["c", "d"]


def test_collect_dicts_per_key_and_tuples_elementwise():
    mesh = DeviceMesh.from_sizes(dp_size=2)
    results = [
        {"loss": 1.0, "acc": (0.5, np.array([1.0]))},
        {"loss": 3.0, "acc": (1.5, np.array([3.0]))},
    ]
    out = C["mean"].collect(results, mesh)
    assert out["loss"] == 2.0
    assert out["acc"][0] == 1.0
    np.testing.assert_array_equal(out["acc"][1], [2.0])
    cat = C["concat"].collect([(np.array([1]), [1]), (np.array([2]), [2])], mesh)
    np.testing.assert_array_equal(cat[0], [1, 2])
    assert cat[1] == [1, 2]


def test_collect_rejects_mismatched_dict_keys():
    with pytest.raises(ValueError, match="keys differ"):
        C["mean"].collect([{"a": 1}, {"b": 2}], DeviceMesh.from_sizes(dp_size=2))


def test_concat_scalars_becomes_an_array():
    out = C["concat"].collect([np.float64(1.0), np.float64(2.0)], DeviceMesh.from_sizes(dp_size=2))
    np.testing.assert_array_equal(out, [1.0, 2.0])


def test_mean_without_mesh_uses_every_result():
    assert C["mean"].collect([1.0, 2.0, 6.0], None) == 3.0


_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


@given(st.lists(_SHAPES, min_size=2, max_size=5), st.sampled_from(["sum", "mean"]))
def test_sum_and_mean_add_one_shape_and_refuse_shapes_that_differ(shapes, name):
    # Element-wise, as an all-reduce: results of one shape add up; results whose shapes
    # differ between workers (numpy would broadcast (1, 3) and (2, 3) into one) are refused.
    results = [np.full(shape, float(i + 1)) for i, shape in enumerate(shapes)]
    if len(set(shapes)) > 1:
        with pytest.raises(ValueError, match=r"shapes differ between workers"):
            C[name].collect(results, None)
        return
    total = sum(range(1, len(shapes) + 1))
    expected = total if name == "sum" else total / len(shapes)
    np.testing.assert_array_equal(C[name].collect(results, None), np.full(shapes[0], expected))


@pytest.mark.parametrize(
    "results",
    [[[0], [1]], [(1, 2), (1, 2, 3)], ["a", "b"], [None, 1.0], [np.zeros(3), 1.0]],
    ids=["lists", "tuples-of-two-lengths", "strings", "none", "array-beside-number"],
)
def test_sum_refuses_what_plus_would_join_or_broadcast(results):
    with pytest.raises(ValueError, match=r"'\+' would join|shapes differ"):
        C["sum"].collect(results, None)


def test_sum_still_adds_objects_of_their_own_that_define_plus():
    class Tally:
        def __init__(self, n):
            self.n = n

        def __add__(self, other):
            return Tally(self.n + other.n)

    assert C["sum"].collect([Tally(1), Tally(2), Tally(4)], None).n == 7
