"""Summing a relayed call's large results node by node (`twinkle_ray/node_reduce.py`), on the
session's two-node cluster: a group of six workers, three per node, whose `collect='sum'` and
`'mean'` results are taken where they are, node after node in rank order, and equal the
driver's sum and in-process mode's bit for bit."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time

import numpy as np
import pytest
import ray.cloudpickle
import torch
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import (
    CollectError,
    DeviceGroup,
    get_worker_context,
    group_state,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugin import MeanCollector, SumCollector
from twinkle_ray import node_reduce
from twinkle_ray.node_reduce import chain_saves, node_runs

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Elements per array: 256 KiB of float32, over the size a worker leaves in the object store.
N = 64 * 1024


#: Workers of the group: three on each node (two would not be summed on the relays: the
#: chain would move as many results between nodes as the driver fetching them).
W = 6


def _values(rank: int) -> np.ndarray:
    """Rank `rank`'s float32 array: magnitudes far apart between ranks, so that adding the
    six in another order than rank order gives other bits."""
    rng = np.random.default_rng(rank)
    return (rng.standard_normal(N) * 10.0 ** (3 * (rank % 2))).astype(np.float32)


@remote_class()
class Grads:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="sum")
    def summed(self):
        rank = get_worker_context().rank
        return {"w": _values(rank), "t": torch.from_numpy(_values(rank + 10)), "n": rank}

    @remote_function(dispatch="all", collect="mean")
    def averaged(self):
        return _values(get_worker_context().rank)

    @remote_function(dispatch="all", collect="sum")
    def ragged(self):
        """Arrays whose lengths differ between ranks: they do not add."""
        return np.zeros(N + get_worker_context().rank, np.float32)


def _expected() -> tuple[dict, np.ndarray]:
    """What in-process mode gives: core's collectors over the four results, in rank order."""
    results = [{"w": _values(r), "t": torch.from_numpy(_values(r + 10)), "n": r} for r in range(W)]
    return (
        SumCollector().collect(results, None),
        MeanCollector().collect([_values(r) for r in range(W)], None),
    )


def _start(cluster, name: str, **options) -> None:
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("spread", W, "cpu")],
        name=name,
        placement_timeout=60,
        cpus_per_worker={"spread": 2.0},  # three on each 6-CPU node
        **options,
    )


@pytest.mark.slow
def test_sums_are_taken_node_by_node_with_the_driver_paths_bits(cluster, no_runtime):
    summed, averaged = _expected()
    # The data tell the orders apart: per-node sums added together give other bits.
    nodes = (_values(0) + _values(1) + _values(2)) + (_values(3) + _values(4) + _values(5))
    assert not np.array_equal(nodes, summed["w"])
    got: dict[str, tuple] = {}
    for shape, options in (("relayed", {"relay_min_nodes": 2}), ("direct", {"relay_min_nodes": 0})):
        _start(cluster, f"node-reduce-{shape}", **options)
        try:
            grads = Grads(remote_group="spread")
            route = grads.__dict__["_twinkle_binding"].workers.route
            assert (route is not None) == (shape == "relayed")
            before = node_reduce.reduced_calls()
            got[shape] = (grads.summed()(120), grads.averaged()(120))
            # Relayed: both calls were summed on the relays; direct: neither.
            assert node_reduce.reduced_calls() - before == (2 if shape == "relayed" else 0)
            with pytest.raises(CollectError, match="could not combine"):
                grads.ragged()(120)  # the chain fails; the driver's path raises its error
            assert node_reduce.reduced_calls() - before == (2 if shape == "relayed" else 0)
        finally:
            shutdown()
    for shape, (total, mean) in got.items():
        assert total["n"] == sum(range(W)), shape
        # Read after the run ended: the driver's own (writable) copies, not store views.
        assert total["w"].flags.writeable and mean.flags.writeable, shape
        assert total["w"].dtype == np.float32 and np.array_equal(total["w"], summed["w"]), shape
        assert isinstance(total["t"], torch.Tensor) and torch.equal(total["t"], summed["t"])
        assert mean.dtype == averaged.dtype and np.array_equal(mean, averaged), shape


@pytest.mark.slow
def test_a_relay_dying_before_the_sum_leaves_it_to_the_driver(cluster, no_runtime):
    """The call finished, its replies fetched; then the second node's relay is SIGKILLed.
    Collecting it, the chain fails on the dead relay and the driver sums the results itself,
    which the workers still hold: the same bits, no error, no restart, and not counted as
    summed on the relays."""
    summed, _ = _expected()
    _start(cluster, "node-reduce-killed", relay_min_nodes=2)
    try:
        grads = Grads(remote_group="spread")
        route = grads.__dict__["_twinkle_binding"].workers.route
        assert route is not None and len(route.relays) == 2
        lazy = grads.summed()
        lazy.source.pending.wait_replies(120)  # finished, the replies on the driver
        pid = ray.get(route.relays[1].__ray_call__.remote(lambda _: os.getpid()), timeout=30)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # dead, as Ray's control store lists it
            try:
                ray.get(route.relays[1]._tw_ready.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                break
            time.sleep(0.1)
        before = node_reduce.reduced_calls()
        total = lazy(120)
        assert node_reduce.reduced_calls() == before
        assert np.array_equal(total["w"], summed["w"]) and torch.equal(total["t"], summed["t"])
        assert group_state("spread").restarts == 0
    finally:
        shutdown()


@given(st.lists(st.integers(0, 3), max_size=40))
def test_node_runs_cover_the_results_in_order_one_node_per_run(nodes):
    runs = node_runs(nodes)
    assert [n for node, start, stop in runs for n in [node] * (stop - start)] == nodes
    starts = [start for _, start, _ in runs]
    assert starts == [0, *(stop for _, _, stop in runs[:-1])][: len(runs)]
    assert all(stop > start for _, start, stop in runs)
    assert all(a[0] != b[0] for a, b in itertools.pairwise(runs))


@given(st.lists(st.sampled_from("ABC"), max_size=24), st.sampled_from("ABCD"))
def test_the_chain_is_used_only_where_it_moves_fewer_results(nodes, here):
    """Against a count made here: results the driver fetches from other nodes, and the
    chain's hops (one per change of node, and the last node's sum to the driver)."""
    fetched = sum(node != here for node in nodes)
    hops = sum(a != b for a, b in itertools.pairwise(nodes)) + (bool(nodes) and nodes[-1] != here)
    assert chain_saves(nodes, here) == (hops < fetched)


def test_the_chain_pays_off_from_three_results_on_a_node():
    assert not chain_saves(["A", "A", "B", "B"], "A")  # 2 fetched, 2 hops
    assert chain_saves(["A", "A", "A", "B", "B", "B"], "A")  # 3 fetched, 2 hops
    assert chain_saves(["B", "B", "B", "A", "A", "A"], "A")  # 3 fetched, 1 hop
    assert not chain_saves(["A", "B", "C", "D"], "A")  # one per node: only hops
    assert chain_saves(["B", "B", "C", "C"], "A")  # 4 fetched, 2 hops
