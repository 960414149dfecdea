"""Per-node relays (`twinkle_ray/relay.py`) on the session's two-node cluster: a group spanning
both nodes sends each call once per node, and its results, order, failures (user errors, late
failures, a SIGKILLed worker), hand-offs, colocated objects and restarts are those of the
direct path, which the same checks run against with `relay_min_nodes=0`.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch

from twinkle_core import (
    CallLostError,
    ConfigurationError,
    DeviceGroup,
    WorkerDiedError,
    get_worker_context,
    group_state,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_ray import transports
from twinkle_ray.relay import submit_on

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow


@remote_class()
class Recorder:
    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.seen: list = []

    @remote_function(dispatch="all", collect="none")
    def where(self):
        return [ray.get_runtime_context().get_node_id(), os.getpid(), get_worker_context().rank]

    @remote_function(dispatch="all", collect="none")
    def note(self, value):
        self.seen.append(value)
        return get_worker_context().rank * 1000 + self.base + len(self.seen)

    @remote_function(dispatch="all", collect="none", execute="first")
    def note_first(self, value):
        """Rank 0 only: a call reaching one node, which goes to its relay directly."""
        self.seen.append(value)
        return len(self.seen)

    @remote_function(dispatch="all", collect="none")
    def history(self):
        return list(self.seen)

    @remote_function(dispatch="slice_dp", collect="concat")
    def scaled(self, batch, factor):
        return batch * factor + get_worker_context().rank

    @remote_function(dispatch="all", collect="none")
    def fail_on(self, rank: int, later_rank: int = -1, later_s: float = 0.0, nap: float = 0.0):
        me = get_worker_context().rank
        if me == rank:
            raise ValueError(f"rank {rank} refuses")
        if me == later_rank:
            time.sleep(later_s)
            raise KeyError(f"rank {later_rank} fails later")
        time.sleep(nap)
        return me

    @remote_function(dispatch="all", collect="none")
    def fail_or_none(self, rank: int):
        """Rank `rank` raises; the others return None at once (a reply a relay's report holds
        as None, which must not read as "no report")."""
        if get_worker_context().rank == rank:
            raise ValueError(f"rank {rank} refuses")

    @remote_function(dispatch="all", collect="none")
    def nap(self, seconds: float):
        time.sleep(seconds)
        return get_worker_context().rank

    @remote_function(dispatch="slice_dp", collect="concat")
    def rows(self, n: int):
        return np.full((2, 3), float(get_worker_context().rank + n))

    @remote_function(dispatch="all", collect="concat", transport="gloo")
    def held_rows(self, n: int):
        """A 1 MiB tensor per rank, kept by its worker until a consumer receives it."""
        return torch.full((n, 256), float(get_worker_context().rank + 1), dtype=torch.float64)


@remote_class()
class Consumer:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="slice_dp", collect="concat")
    def total(self, batch):
        return np.asarray(batch).sum(axis=1)

    @remote_function(dispatch="all", collect="none")
    def echo(self, value):
        return value


#: CPU groups are packed onto as few nodes as hold them: 2.5 CPUs per worker of 'spread' puts
#: two of its workers on each 6-CPU node, leaving room for 'other'.
SPREAD = {"spread": 2.5, "other": 0.5}


def _start(cluster, name: str, restarts: int = 0) -> None:
    initialize(
        "ray",
        address=cluster.address,
        nproc_per_node=2,
        groups=[
            DeviceGroup("spread", [0, 1, 2, 3], "cpu", max_restarts=restarts),
            DeviceGroup("other", [0, 2], "cpu"),
        ],
        name=name,
        placement_timeout=60,
        cpus_per_worker=SPREAD,
    )


def _route(obj):
    return obj.__dict__["_twinkle_binding"].workers.route


def _exercise(recorder: Recorder) -> dict:
    """What the checks compare between the relayed and the direct path."""
    out: dict = {}
    out["where"] = recorder.where()()
    out["first"] = recorder.note({"step": 0, "lr": 0.1})()
    pending = [recorder.note(i) for i in range(300)]  # issued at once, resolved later
    out["pipelined"] = [p() for p in pending[::37]]
    out["history"] = recorder.history()()
    batch = np.arange(24, dtype=np.float64).reshape(8, 3)
    out["scaled"] = recorder.scaled(batch, 2.0)()
    # Calls to every node and calls to rank 0's node alone, interleaved and pipelined.
    mixed = [recorder.note_first(-i) if i % 3 == 0 else recorder.note(-i) for i in range(60)]
    out["mixed"] = [m() for m in mixed][-1]
    out["history after"] = recorder.history()()
    try:
        recorder.fail_or_none(3)(60)
    except Exception as exc:  # the one failure, as the user's own exception
        out["failure"] = (type(exc).__name__, str(exc).splitlines()[-1])
    return out


def _check(out: dict) -> None:
    nodes = {node for node, _, _ in out["where"]}
    assert len(nodes) == 2, f"the group must span both nodes: {out['where']}"
    assert [r for _, _, r in out["where"]] == [0, 1, 2, 3]
    assert out["first"] == [r * 1000 + 7 + 1 for r in range(4)]  # Recorder(7): base 7
    expected = [{"step": 0, "lr": 0.1}, *range(300)]
    for rank, seen in enumerate(out["history"]):
        assert seen == expected, f"rank {rank} saw the calls in another order"
    batch = np.arange(24, dtype=np.float64).reshape(8, 3)
    want = np.concatenate([batch[2 * r : 2 * r + 2] * 2.0 + r for r in range(4)])
    np.testing.assert_array_equal(out["scaled"], want)
    everyone = [-i for i in range(60) if i % 3]
    for rank, seen in enumerate(out["history after"]):
        tail = [-i for i in range(60)] if rank == 0 else everyone
        assert seen == [*expected, *tail], f"rank {rank} saw the mixed calls in another order"
    assert out["failure"][0] == "ValueError" and "rank 3 refuses" in out["failure"][1], out


#: The shapes the order test compares: a branch (the driver sends one task to the first
#: node's relay, which hands the second node's part on), a relay per node reached by the
#: driver itself, and no relays.
SHAPES = {
    "branch": {"relay_min_nodes": 2},
    "per-node": {"relay_min_nodes": 2, "relay_fanout": 1},
    "direct": {"relay_min_nodes": 0},
}


def test_relayed_calls_give_the_direct_paths_results_in_the_same_order(cluster, no_runtime):
    results = {}
    for shape, options in SHAPES.items():
        initialize(
            "ray",
            address=cluster.address,
            nproc_per_node=2,
            groups=[DeviceGroup("spread", [0, 1, 2, 3], "cpu")],
            name=f"relay-order-{shape}",
            cpus_per_worker=SPREAD,
            **options,
        )
        try:
            recorder = Recorder(7, remote_group="spread")
            route = _route(recorder)
            if shape != "direct":
                assert route is not None and len(route.relays) == 2
                assert route.fanout == (2 if shape == "branch" else 1)
                assert route.ranks_by_node in ([[0, 1], [2, 3]], [[2, 3], [0, 1]])
                relay_nodes = ray.get([r._tw_ready.remote() for r in route.relays])
                worker_nodes = {node for node, _, _ in recorder.where()()}
                assert len(set(relay_nodes)) == 2 and set(relay_nodes) == worker_nodes
            else:
                assert route is None
            results[shape] = _exercise(recorder)
            _check(results[shape])
            if shape != "direct":  # the driver's tasks for a call to both nodes
                tasks = len(recorder.note("shape").source.pending.value_refs.nodes)
                assert tasks == (1 if shape == "branch" else 2), (shape, tasks)
        finally:
            shutdown()
    for shape in ("branch", "per-node"):
        relayed, direct = results[shape], results["direct"]
        for key in ("first", "pipelined", "history", "mixed", "failure"):
            assert relayed[key] == direct[key], (shape, key)
        np.testing.assert_array_equal(relayed["scaled"], direct["scaled"])


def test_two_branches_of_two_nodes_keep_order_and_fail_fast(cluster, no_runtime):
    """Four nodes (the session's two and two more), one worker on each, `relay_fanout=2`: two
    branches, so a call is two tasks from the driver, each to a branch's first relay, which
    hands its second node the share. Calls to every node and to rank 0 alone keep one order
    on every worker; a failure on the second branch's second node reaches the caller, with a
    later one on the first branch's first node as a note."""
    added = [cluster.add_node(num_cpus=6, object_store_memory=80 * 1024 * 1024) for _ in range(2)]
    try:
        cluster.wait_for_nodes(timeout=60)
        initialize(
            "ray",
            address=cluster.address,
            groups=[DeviceGroup("wide", 4, "cpu")],
            name="relay-branches",
            relay_fanout=2,
            cpus_per_worker=5,  # one bundle per 6-CPU node
            placement_timeout=60,
        )
        try:
            recorder = Recorder(remote_group="wide")
            route = _route(recorder)
            nodes = [node for node, _, _ in recorder.where()()]
            assert len(set(nodes)) == 4, nodes
            assert route is not None and route.fanout == 2 and len(route.relays) == 4
            assert route.ranks_by_node == [[0], [1], [2], [3]]
            assert len(recorder.note("start").source.pending.value_refs.nodes) == 2
            calls = [recorder.note_first(i) if i % 4 == 0 else recorder.note(i) for i in range(80)]
            # Rank 0 saw every call, the others the start and the 60 calls to all.
            assert calls[-1]() == [81, 1061, 2061, 3061]
            history = recorder.history()()
            everyone = ["start", *(i for i in range(80) if i % 4)]
            assert history[1:] == [everyone] * 3
            assert history[0] == ["start", *range(80)]
            with pytest.raises(ValueError, match="rank 3 refuses") as info:
                recorder.fail_on(3, later_rank=0, later_s=1.0, nap=3)()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "also failed" not in str(
                getattr(info.value, "__notes__", "")
            ):
                time.sleep(0.1)
            notes = "\n".join(getattr(info.value, "__notes__", []))
            assert "rank 0" in notes and "KeyError" in notes, notes
            assert not any(f"rank {r} " in notes for r in (1, 2)), notes
            assert recorder.nap(0)() == [0, 1, 2, 3]  # still serving, in order
        finally:
            shutdown()
    finally:
        for node in added:
            cluster.remove_node(node)


@pytest.mark.parametrize(
    ("which", "how", "busy"),
    [(0, "ray.kill", True), (1, "SIGKILL", True), (0, "SIGKILL", False)],
    ids=["branch-first", "second", "while-idle"],
)
def test_a_relay_dying_alone_loses_its_calls_but_not_the_workers(
    cluster, no_runtime, which, how, busy
):
    """A relay killed on its own (its node and workers live on), the branch's first (by Ray)
    or the node it hands calls on to (its process, SIGKILL): the call in flight through it
    (`busy`) fails with `CallLostError` saying
    the worker is alive and whether it ran the call is unknown; then, with no restart (the
    group may restart once, and does not), the next call runs on the same processes, which
    kept their state, through new relays on the same nodes, and the old relays are gone.
    Killed while the group is idle, the relay is replaced before any call needs it: no call
    is lost."""
    initialize(
        "ray",
        address=cluster.address,
        nproc_per_node=2,
        groups=[DeviceGroup("spread", [0, 1, 2, 3], "cpu", max_restarts=1)],
        name=f"relay-killed-{which}",
        cpus_per_worker=SPREAD,
    )
    try:
        recorder = Recorder(remote_group="spread")
        old = _route(recorder)
        assert old is not None and old.fanout == 2
        where = recorder.where()()
        assert recorder.note("before")() == [r * 1000 + 1 for r in range(4)]
        pid = ray.get(old.relays[which].__ray_call__.remote(lambda _: os.getpid()))
        assert pid not in [p for _, p, _ in where]
        handles = recorder.__dict__["_twinkle_binding"].workers.handles
        rank = 0 if which == 0 else 2  # on the killed relay's node
        given = transports.given_ref(handles[rank], "not-held")  # sent through the relay
        with pytest.raises(ray.exceptions.RayTaskError, match="no longer held"):
            ray.get(given, timeout=30)
        assert "not-held" in transports._GIVEN
        running = recorder.nap(3) if busy else None  # in flight when the relay dies
        time.sleep(0.5)
        if how == "SIGKILL":
            os.kill(pid, signal.SIGKILL)
        else:
            ray.kill(old.relays[which], no_restart=True)
        start = time.monotonic()
        if running is not None:
            with pytest.raises(CallLostError) as info:
                running(60)
            assert time.monotonic() - start < 30.0
            text = str(info.value)
            assert "relay" in text and "is alive" in text and "unknown" in text, text
        else:  # noticed without a call (`Route.watch`): replaced before the next call
            while _route(recorder) in (old, None) and time.monotonic() - start < 60:
                time.sleep(0.05)
            assert _route(recorder) not in (old, None)
        # Waits for the new relays (after the workers ran what the old ones handed them).
        assert recorder.note("after")(120) == [r * 1000 + 2 for r in range(4)]
        assert recorder.history()() == [["before", "after"]] * 4  # their state, kept
        assert recorder.where()() == where  # the same processes
        state = group_state("spread")
        assert (state.state, state.generation, state.restarts) == ("healthy", 0, 0), state
        new = _route(recorder)
        assert new is not None and new is not old and new.fanout == 2
        nodes = ray.get([r._tw_ready.remote() for r in new.relays], timeout=30)
        assert nodes == [where[0][0], where[2][0]]  # one per node, in the same order
        for relay in old.relays:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(relay._tw_ready.remote(), timeout=30)
        # A task sent through the dead relay (as held-result sends and collective joins are,
        # in the moment before the driver notices) fails as a lost call, not as the relay's
        # own death; the refs the old relays owned were forgotten, to be asked for again.
        with pytest.raises(CallLostError, match=f"rank {rank} .*the worker is alive"):
            submit_on(old, rank, handles[rank], "_tw_ping", (), {})
        assert "not-held" not in transports._GIVEN
    finally:
        shutdown()


def test_a_relay_dying_while_its_workers_run_past_the_start_timeout(cluster, no_runtime, caplog):
    """A relay killed (SIGKILL) while every worker runs a call longer than the run's start
    timeout: the call fails with `CallLostError` at once; the workers cannot answer the
    liveness task that would show they caught up, so after the start timeout new relays
    start anyway (logged). A call made meanwhile waits at most that long, then runs after
    the long call on every worker, in order, on the same processes with their state: nothing
    hangs, restarts or runs twice."""
    start_timeout, nap = 12.0, 20.0
    initialize(
        "ray",
        address=cluster.address,
        nproc_per_node=2,
        groups=[DeviceGroup("spread", [0, 1, 2, 3], "cpu", max_restarts=1)],
        name="relay-killed-busy",
        cpus_per_worker=SPREAD,
        start_timeout=start_timeout,
    )
    try:
        recorder = Recorder(remote_group="spread")
        old = _route(recorder)
        assert old is not None
        where = recorder.where()()
        assert recorder.note("before")() == [r * 1000 + 1 for r in range(4)]
        pid = ray.get(old.relays[1].__ray_call__.remote(lambda _: os.getpid()))
        running = recorder.nap(nap)
        time.sleep(1.0)  # every worker is napping
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(CallLostError):
            running(60)
        assert time.monotonic() - killed < 10.0
        after = recorder.note("after")  # waits for the replacement, at most the start timeout
        assert after(120) == [r * 1000 + 2 for r in range(4)]
        took = time.monotonic() - killed
        assert nap - 2.0 < took < nap + start_timeout + 30.0, took  # after the nap, bounded
        assert recorder.history()() == [["before", "after"]] * 4  # each worker ran it once
        assert recorder.where()() == where  # the same processes
        state = group_state("spread")
        assert (state.state, state.generation, state.restarts) == ("healthy", 0, 0), state
        assert "did not answer within" in caplog.text, caplog.text  # the corner was reached
        new = _route(recorder)
        assert new is not None and new is not old
        assert recorder.note("later")() == [r * 1000 + 3 for r in range(4)]
    finally:
        shutdown()


def test_every_call_resolves_when_one_relay_returns_many_replies(cluster, no_runtime):
    """All 8 replies of a node come back in its relay's one list, each to its own rank, call
    after call (a first version, with one return value per worker, landing one after the
    other, called itself timed out within a few hundred calls)."""
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("eight", 8, "cpu")],
        name="relay-returns",
        relay_min_nodes=1,  # a relay even on one node: all 8 replies come back in one task
        cpus_per_worker=0.5,
    )
    try:
        recorder = Recorder(remote_group="eight")
        route = _route(recorder)
        assert route is not None and len(route.relays) == 1
        assert route.ranks_by_node == [list(range(8))]
        for i in range(400):
            assert recorder.note(i)(30) == [r * 1000 + i + 1 for r in range(8)]
        refs = recorder.note(400).source.pending.value_refs
        assert len(refs) == 8 and len(refs.nodes) == 1  # the driver owns one ref per node
    finally:
        shutdown()


@pytest.fixture(scope="module")
def relayed(cluster):
    _start(cluster, "relay-run", restarts=1)
    try:
        yield
    finally:
        shutdown()


@pytest.mark.parametrize(
    ("first", "later"),
    [(3, 0), (0, 3)],
    ids=["second-node-first", "first-node-first"],
)
def test_a_failure_reaches_the_caller_at_once_with_late_ones_as_notes(relayed, first, later):
    """Ranks 0-1 sit on the branch's first node (its relay got the call from the driver),
    2-3 on the second (its relay got it from the first's). Either node's failure comes first:
    the second node's travels one hop more; after the first node's, the second's workers are
    reported running by their relay's task (`StillRunning` with an index), and rank 3's later
    failure is found through that task's report."""
    recorder = Recorder(remote_group="spread")
    assert _route(recorder) is not None
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"rank {first} refuses") as info:
        # `first` fails at once; `later` 1.5 s later; the others still run for 4 s.
        recorder.fail_on(first, later_rank=later, later_s=1.5, nap=4)()
    took = time.monotonic() - start
    print(f"first failure reached the caller in {took * 1000:.0f} ms")
    assert took < 10.0  # about 0.05 s on a quiet machine; bounded for a loaded 2-core one
    assert "test_relay.py" in str(info.value)  # the user's call site
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "also failed" not in str(
        getattr(info.value, "__notes__", "")
    ):
        time.sleep(0.1)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"rank {later}" in notes and "also failed" in notes and "KeyError" in notes, notes
    others = [r for r in range(4) if r not in (first, later)]
    assert not any(f"rank {r} " in notes for r in others), notes  # they succeeded
    # The group still serves (a user error is not a death), in order.
    assert recorder.nap(0)() == [0, 1, 2, 3]


def test_a_lazy_result_of_a_relayed_group_is_handed_to_another_group(relayed):
    producer = Recorder(remote_group="spread")
    consumer = Consumer(remote_group="other")
    assert _route(producer) is not None
    rows = producer.rows(1)
    total = consumer.total(rows)()
    want = np.concatenate([np.full((2, 3), float(r + 1)) for r in range(4)]).sum(axis=1)
    np.testing.assert_array_equal(total, want)


def test_held_and_whole_results_of_a_relayed_group_reach_another_group(relayed):
    """A relayed call's driver-side refs are one per node (each holding its node's replies);
    handed to another group, every worker's reply gets a ref of its own: a result held by its
    producer (gloo transport) is sent from the right rank, and a whole result
    (`dispatch='all'`, `collect='none'`) reaches every consumer as the driver would see it."""
    from twinkle_ray.transports import Held

    producer = Recorder(remote_group="spread")
    consumer = Consumer(remote_group="other")
    assert _route(producer) is not None
    lazy = producer.held_rows(1024)
    pending = lazy.source.pending
    # One driver task for the call: both nodes form one branch (relay_fanout 8).
    assert len(pending.value_refs) == 4 and len(pending.value_refs.nodes) == 1
    assert all(type(r) is Held for r in pending.wait_replies(120))
    got = consumer.total(lazy)(120)  # 'other' has 2 workers: each sums 2 ranks' rows
    want = np.concatenate([np.full(1024, 256.0 * (r + 1)) for r in range(4)])
    np.testing.assert_array_equal(got, want)
    where = producer.where()
    assert consumer.echo(where)(120) == [where(120)] * 2


def test_colocated_objects_share_the_relays_and_keep_one_order(relayed):
    first = Recorder(1, remote_group="spread")
    pending = [first.note(i) for i in range(50)]
    second = Recorder(2, remote_group="spread")  # built in the same actors, after those calls
    assert _route(second) is _route(first) is not None
    assert first.where()() == second.where()()
    mixed = []
    for i in range(40):
        mixed.append((first if i % 2 else second).note(i))
    assert [p() for p in pending][-1] == [r * 1000 + 1 + 50 for r in range(4)]
    assert first.history()()[0] == [*range(50), *range(1, 40, 2)]
    assert second.history()()[0] == list(range(0, 40, 2))
    assert [m() for m in mixed][-1] == [r * 1000 + 1 + 70 for r in range(4)]


def test_a_killed_worker_restarts_the_group_behind_new_relays(relayed):
    recorder = Recorder(5, remote_group="spread")
    old = _route(recorder)
    where = recorder.where()()
    running = recorder.nap(60)
    time.sleep(0.5)
    os.kill(where[2][1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        running(timeout=60)
    took = time.monotonic() - start
    assert took < 15.0
    assert "worker rank 2 of group 'spread'" in str(info.value)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and group_state("spread").generation < 1:
        time.sleep(0.2)
    assert recorder.nap(0)(timeout=120) == [0, 1, 2, 3]  # on generation 1
    new = _route(recorder)
    assert new is not None and new is not old
    assert recorder.note("after")() == [r * 1000 + 5 + 1 for r in range(4)]
    # The old generation's relays are gone; the new one's serve on the workers' nodes.
    for relay in old.relays:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(relay._tw_ready.remote(), timeout=30)
    nodes = ray.get([r._tw_ready.remote() for r in new.relays], timeout=30)
    assert set(nodes) == {node for node, _, _ in recorder.where()()}


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_relay_min_nodes_must_be_a_non_negative_integer(value):
    from twinkle_ray.options import RayOptions

    with pytest.raises(ConfigurationError, match="relay_min_nodes") as info:
        RayOptions.parse({"relay_min_nodes": value})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", [0, -2, 2.0, False, "8"])
def test_relay_fanout_must_be_a_positive_integer(value):
    from twinkle_ray.options import RayOptions

    with pytest.raises(ConfigurationError, match=r"relay_fanout=.*positive integer") as info:
        RayOptions.parse({"relay_fanout": value})
    assert repr(value) in str(info.value)
    assert RayOptions.parse({"relay_fanout": 1}).relay_fanout == 1


@remote_class()
class Summer:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def total(self, big, small):
        return [float(np.asarray(big).sum()), small["step"], type(big).__name__]


def test_a_large_argument_for_every_worker_is_put_once_and_reaches_each_node(relayed):
    """A 4 MiB array for every worker (`dispatch='all'`) goes to the object store once
    (`shipping.py`) and through the relays as a ref, which Ray resolves on each worker."""
    summer = Summer(remote_group="spread")
    assert _route(summer) is not None
    big = np.ones(512 * 1024)  # 4 MiB: above the inline limit
    assert summer.total(big, {"step": 9})() == [[float(big.size), 9, "ndarray"]] * 4
