"""The by-reference hand-off between colocated objects (`twinkle_core.handoff`), in-process:
the stand-in `concat` leaves, and what each rank's worker receives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.handoff import RankParts, finish_hand_off, hand_off_value
from twinkle_core.plugin import ConcatCollector

# ----------------------------------------------------------------------------- RankParts
parts_lists = st.lists(st.integers(0, 6), min_size=1, max_size=5).map(
    lambda sizes: [
        np.arange(n * 3, dtype=np.int64).reshape(n, 3) + 100 * i for i, n in enumerate(sizes)
    ]
)


@given(parts_lists, st.integers(-8, 20), st.integers(-8, 20))
def test_any_slice_of_the_stand_in_equals_the_slice_of_the_concatenation(parts, start, stop):
    whole = np.concatenate(parts)
    stand_in = RankParts(parts)
    assert len(stand_in) == len(whole) and stand_in.shape == whole.shape
    got = stand_in[start:stop]
    np.testing.assert_array_equal(got, whole[start:stop])


@given(parts_lists)
def test_a_slice_covering_one_part_exactly_is_that_part(parts):
    stand_in = RankParts(parts)
    offset = 0
    for part in parts:
        got = stand_in[offset : offset + len(part)]
        if len(part):
            assert got is part
        offset += len(part)


@given(parts_lists)
def test_slice_dp_over_the_stand_in_gives_what_it_gives_over_the_value(parts):
    from twinkle_core.plugin import BUILTIN_DISPATCHERS

    results = [{"x": p, "tag": [i] * len(p)} for i, p in enumerate(parts)]
    mesh = DeviceMesh.from_sizes(dp_size=len(parts))
    value = ConcatCollector().collect(results, mesh)
    handed = hand_off_value(ConcatCollector(), mesh, results)
    dispatch = BUILTIN_DISPATCHERS["slice_dp"].dispatch
    if len(value["tag"]) < len(parts):
        return  # slice_dp refuses a batch smaller than the shard count (tested elsewhere)
    want = dispatch((value,), {}, len(parts), mesh)
    got = finish_hand_off(dispatch((handed,), {}, len(parts), mesh))
    for (w, _), (g, _) in zip(want, got, strict=True):
        np.testing.assert_array_equal(g[0]["x"], w[0]["x"])
        assert g[0]["tag"] == w[0]["tag"]
        assert type(g[0]["x"]) is np.ndarray


def test_finishing_makes_one_array_for_every_worker_that_gets_the_stand_in_whole():
    stand_in = RankParts([np.zeros((2, 2)), np.ones((2, 2))])
    out = finish_hand_off([((stand_in,), {"k": stand_in}), ((stand_in,), {})])
    assert out[0][0][0] is out[1][0][0] is out[0][1]["k"]
    np.testing.assert_array_equal(out[0][0][0], np.concatenate(stand_in.parts))


# ----------------------------------------------------------------------------- in-process
_MADE: dict[int, np.ndarray] = {}


def _rank() -> int:
    return get_worker_context().rank


@remote_class()
class Maker:
    @remote_function(dispatch="all", collect="concat")
    def make(self, rows=4):
        out = _MADE[_rank()] = np.full((rows, 2), float(_rank()))
        return out

    @remote_function(dispatch="all", collect="none")
    def make_small(self):
        out = _MADE[_rank()] = np.array([float(_rank())])
        return out


@remote_class()
class Taker:
    @remote_function(dispatch="slice_dp", collect="none")
    def same(self, x):
        return [x is _MADE[_rank()], x.tolist()]

    @remote_function(dispatch="slice_dp", collect="none")
    def write(self, x):
        x += 10  # in place: by reference, the producer's own array changes too
        return True

    @remote_function(dispatch=lambda a, k, n, mesh: [(a, k)] * n, collect="none")
    def same_custom(self, x):
        return [x is _MADE[_rank()], x.shape[0]]

    @remote_function(dispatch="all", collect="none")
    def same_in_list(self, xs):
        return [x is _MADE[_rank()] for x in xs]


@pytest.fixture(params=[True, False], ids=["isolate", "shared"])
def run(request):
    _MADE.clear()
    initialize(
        mode="inprocess", isolate=request.param, groups=[DeviceGroup("g", 2), DeviceGroup("h", 2)]
    )
    yield request.param
    shutdown()


def test_each_rank_receives_its_own_result_by_reference(run):
    maker, taker = Maker(remote_group="g"), Taker(remote_group="g")
    assert taker.same(maker.make(2))() == [
        [True, [[0.0, 0.0], [0.0, 0.0]]],
        [True, [[1.0, 1.0], [1.0, 1.0]]],
    ]
    # small results too: the rank's own one among the others' (copies under isolate)
    assert taker.same_in_list(maker.make_small())() == [[True, False], [False, True]]


def test_writing_into_a_result_handed_on_changes_the_producers_object_not_the_drivers(run):
    maker, taker = Maker(remote_group="g"), Taker(remote_group="g")
    made = maker.make(2)
    taker.write(made)()
    assert float(_MADE[0][0, 0]) == 10.0 and float(_MADE[1][0, 0]) == 11.0
    driver = made()
    # isolate: the driver holds the copy made when the call returned
    assert float(driver[0, 0]) == (0.0 if run else 10.0)


def test_another_group_and_a_users_dispatcher_receive_values(run):
    maker = Maker(remote_group="g")
    other, taker = Taker(remote_group="h"), Taker(remote_group="g")
    made = maker.make(2)
    assert [row[0] for row in other.same(made)()] == [False, False]
    # the user's dispatcher sees the collected value, never a stand-in
    assert taker.same_custom(made)() == [[False, 4], [False, 4]]
