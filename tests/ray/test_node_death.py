"""Losing a node: a throwaway node joins the session cluster, a group spans it and the two
session nodes, and the node is killed without warning (its raylet and every process on it, as
when a machine drops off the network). The driver's blocking call must raise `WorkerDiedError`
naming group, rank and node within seconds, the whole group is torn down, and `shutdown()`
leaves nothing of the run behind."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray
import ray.cloudpickle
from _support.processes import alive

from twinkle_core import (
    DeviceGroup,
    WorkerDiedError,
    get_worker_context,
    group_state,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUN = "node-death"


@remote_class()
class Sleeper:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def where(self):
        return ray.get_runtime_context().get_node_id(), os.getpid(), get_worker_context().rank

    @remote_function(dispatch="all", collect="none")
    def nap(self, seconds):
        time.sleep(seconds)
        return get_worker_context().rank


def _leftovers() -> tuple[list, list]:
    """Placement groups and actors of this run that Ray still holds."""
    pgs = [
        p["name"]
        for p in ray.util.placement_group_table().values()
        if p["name"].startswith(RUN) and p["state"] != "REMOVED"
    ]
    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(RUN)
    ]
    return pgs, actors


def test_lost_node_raises_worker_died_tears_down_the_group_and_leaves_nothing(cluster, no_runtime):
    node = cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=80 * 1024 * 1024)
    removed = False
    try:
        cluster.wait_for_nodes(timeout=60)
        initialize(
            "ray",
            address=cluster.address,
            nproc_per_node=2,
            groups=[
                DeviceGroup("spread", [0, 2, 4], "cuda"),
                DeviceGroup("idle", [1, 3, 5], "cuda"),
                DeviceGroup("phoenix", [0, 2, 4], "cuda", max_restarts=1),
            ],
            # Also bounds a restart's actors coming up. Device discovery of 3 groups took over
            # 6 s on a loaded 2-core machine: 20 s leaves room and stays far below the
            # start_timeout a restart would otherwise wait.
            placement_timeout=20,
            name=RUN,
        )
        spread = Sleeper(remote_group="spread")
        idle = Sleeper(remote_group="idle")  # no call in flight when the node goes
        phoenix = Sleeper(remote_group="phoenix")  # restartable, but its node is gone
        idle_rank = [r for node_id, _, r in idle.where()() if node_id == node.node_id]
        where = spread.where()()
        doomed = [rank for node_id, _, rank in where if node_id == node.node_id]
        assert len(doomed) == 1, f"one rank must sit on the throwaway node: {where}"
        rank = doomed[0]
        label = spread.__dict__["_twinkle_binding"].workers.placements[rank].node
        assert label.endswith(node.node_id[:8])
        survivors = [pid for node_id, pid, _ in where if node_id != node.node_id]

        lazy = spread.nap(120)
        time.sleep(0.5)  # the call is running everywhere
        cluster.remove_node(node, allow_graceful=False)  # SIGKILL: no goodbye to the GCS
        removed = True
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            lazy(timeout=60)
        took = time.monotonic() - start
        print(f"node death detected in {took:.2f}s: {info.value}")
        assert took < 30.0
        message = str(info.value)
        assert f"rank {rank} of group 'spread'" in message and label in message
        assert "tore down the whole group" in message
        assert "unreachable" in message or "died with its node" in message
        # The survivors on the healthy nodes were killed too; new calls fail at once.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(alive(p) for p in survivors):
            time.sleep(0.1)
        assert not any(alive(p) for p in survivors)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="was torn down"):
            spread.where()()
        assert time.monotonic() - start < 1.0
        # A group with no call in flight learns of the loss at its next call, just as fast.
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            idle.where()(timeout=60)
        print(f"idle group: {time.monotonic() - start:.2f}s: {info.value}")
        assert time.monotonic() - start < 30.0
        assert f"rank {idle_rank[0]} of group 'idle'" in str(info.value)
        # A restartable group cannot come back on a lost node: its one restart fails within
        # placement_timeout (the node still looks alive for a while), which spends its budget,
        # and its calls fail saying so.
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            phoenix.where()(timeout=60)
        took = time.monotonic() - start
        text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
        print(f"restart after the loss failed in {took:.2f}s: {text}")
        assert took < 60.0
        # The restart (begun by the liveness probe or by this call's failure) fails within
        # placement_timeout: the group is then dead.
        deadline = time.monotonic() + 60
        while group_state("phoenix").state != "dead" and time.monotonic() < deadline:
            time.sleep(0.2)
        state = group_state("phoenix")
        assert (state.state, state.restarts, state.generation) == ("dead", 1, 0), state
        assert "restart as generation 1 failed" in state.last_cause
        # Under load the restart's actors may be seen dying with the node before the
        # placement_timeout runs out: either way the cause says the node is gone.
        assert any(
            words in state.last_cause
            for words in ("node is most likely gone", "died with its node", "resources are gone")
        ), state.last_cause
        with pytest.raises(WorkerDiedError, match="torn down for good: its restarts are spent"):
            phoenix.where()()
    finally:
        shutdown()
        if not removed:
            cluster.remove_node(node, allow_graceful=False)
    # Nothing of the run survives its shutdown, even the placement group of the lost node.
    ray.init(address=cluster.address)
    try:
        start = time.monotonic()
        left = _leftovers()
        while time.monotonic() < start + 20 and left != ([], []):
            time.sleep(0.2)
            left = _leftovers()
        print(f"leftovers gone {time.monotonic() - start:.2f}s after shutdown: {left}")
        assert left == ([], [])
    finally:
        ray.shutdown()
