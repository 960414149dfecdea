"""Calls on a real Ray cluster: chaining without the driver, shards shipped once, iteration,
sync, the worker environment and placement. One run (and its actors) serves the module."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import twinkle_core
from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_device_placement,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.dispatch import SliceDPDispatcher
from twinkle_core.plugin import PreparedCall, WorkerCall
from twinkle_ray.shipping import Shipper, ship_all
from twinkle_ray.transfer import (
    RemoteArray,
    RemoteCollected,
    RemoteValue,
    Stored,
    tensor_from_numpy,
    tensor_to_numpy,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class Producer:
    def __init__(self) -> None:
        self.seen: list = []

    @remote_function(dispatch="slice_dp", collect="concat")
    def square(self, batch):
        return np.asarray(batch) ** 2

    @remote_function(dispatch="all", collect="none")
    def tag(self):
        return f"p{get_worker_context().rank}"

    @remote_function(dispatch="slice_dp", collect="none")
    def receive(self, batch):
        self.seen.append(batch)
        return [type(batch).__name__, len(batch), float(np.sum(batch))]

    @remote_function(dispatch="slice_dp", collect="sum")
    def total(self, batch):
        return float(np.sum(batch))

    @remote_function(dispatch="all", collect="none", sync=True)
    def slow_mark(self, seconds):
        import time

        time.sleep(seconds * get_worker_context().rank)
        return get_worker_context().rank

    @remote_function(dispatch="all", collect="none")
    def environment(self, names):
        return {n: os.environ.get(n) for n in names}


@remote_class()
class Consumer:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    @remote_function(dispatch="slice_dp", collect="concat")
    def shift(self, values):
        return np.asarray(values) * self.scale + get_worker_context().rank * 1000

    @remote_function(dispatch="slice_dp", collect="none")
    def describe(self, values):
        return [type(values).__name__, list(np.asarray(values).tolist())]

    @remote_function(dispatch="all", collect="none")
    def tags(self, items):
        return list(items)

    @remote_function(dispatch="all", collect="first")
    def plus(self, value):
        return [type(value).__name__, value + 1]

    @remote_function(dispatch="all", collect="concat")
    def tensor_rows(self, n):
        base = torch.arange(1000, dtype=torch.float64).reshape(100, 10)
        return base[get_worker_context().rank * 10 :][:n]  # a view of a larger storage

    @remote_function(dispatch="all", collect="first")
    def tensor_info(self, t):
        return [str(t.dtype), list(t.shape), bool(t.requires_grad), float(t.float().sum())]


@remote_class()
class Batches:
    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return {"step": self.i, "x": np.full(3, self.i)}


ENV_NAMES = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TWINKLE_TEST_FLAG",
    "MYAPP_SETTING",
    "TW_TEST_SECRET",
]


@pytest.fixture(scope="module")
def run(cluster):
    os.environ["TW_TEST_SECRET"] = "hunter2"  # must stay on the driver
    os.environ["TWINKLE_TEST_FLAG"] = "on"  # twinkle's own settings travel
    os.environ["MYAPP_SETTING"] = "42"  # travels because the user lists MYAPP_*
    initialize(
        "ray",
        address=cluster.address,
        groups=[
            DeviceGroup("producer", 2, "cpu"),
            DeviceGroup("consumer", 2, "cpu"),
            DeviceGroup("loader", 1, "cpu"),
        ],
        env_passthrough=["MYAPP_*"],
        cpus_per_worker={"loader": 0.5},
        seed=7,
        name="calls-test",
    )
    try:
        yield {
            "producer": Producer(remote_group="producer"),
            "consumer": Consumer(10.0, remote_group="consumer"),
            "batches": Batches(3, remote_group="loader"),
        }
    finally:
        shutdown()
        for var in ("TW_TEST_SECRET", "TWINKLE_TEST_FLAG", "MYAPP_SETTING"):
            os.environ.pop(var, None)


def _workers(obj):
    return obj.__dict__["_twinkle_binding"].workers


def test_chained_argument_reaches_each_consumer_as_its_own_producer_shard(run):
    producer, consumer = run["producer"], run["consumer"]
    lazy = producer.square(np.arange(6))
    # The consumer group turns the LazyCollect into a placeholder over producer refs...
    placeholder = _workers(consumer).resolve_argument(lazy, PreparedCall("m"))
    assert isinstance(placeholder, RemoteArray) and len(placeholder) == 6
    shares = SliceDPDispatcher().dispatch((placeholder,), {}, 2, DeviceMesh.from_sizes(dp_size=2))
    pending = lazy.source.pending
    # ...so that consumer d's share is exactly producer d's result, nothing else.
    for d, (args, _) in enumerate(shares):
        assert [ref for ref, _, _ in args[0].parts] == [pending.value_refs[d]]
    # End to end: the same values as collecting on the driver first, each worker its shard.
    value = consumer.shift(producer.square(np.arange(6)))()
    assert value.tolist() == [0, 10, 40, 1090, 1160, 1250]
    seen = consumer.describe(producer.square(np.arange(4)))()
    assert seen == [["ndarray", [0, 1]], ["ndarray", [4, 9]]]


def test_chained_producer_results_never_reach_the_driver(run):
    producer, consumer = run["producer"], run["consumer"]
    # Large enough (160 KB per producer worker) to stay in the object store: the driver
    # fetches only the small envelopes that describe them.
    produced = producer.square(np.arange(40_000))
    assert consumer.shift(produced)().tolist()[:2] == [0, 10]
    consumer.describe(np.arange(2))()  # another call: the runtime's bookkeeping runs again
    pending = produced.source.pending
    assert pending._values is None  # only the small metadata was fetched
    assert all(isinstance(reply, Stored) for reply in pending._replies)


def test_what_resolving_an_argument_learns_stays_on_that_call(run):
    """The placeholder's bookkeeping lives on the call's PreparedCall, nowhere on the group or
    the thread: a call that is never submitted (its dispatcher raised) leaves nothing behind,
    and the next call of the group is submitted as a plain one."""
    producer, consumer = run["producer"], run["consumer"]
    workers = _workers(consumer)
    dropped = PreparedCall("shift")
    workers.resolve_argument(producer.square(np.arange(6)), dropped)
    assert dropped.backend_data is not None  # what the submission would have needed
    state = {k: v for k, v in vars(workers).items() if not k.startswith("_send_lock")}
    assert not any("CallArguments" in type(v).__name__ for v in state.values())
    plain = PreparedCall("shift")
    assert plain.backend_data is None
    assert consumer.shift(np.arange(4))().tolist() == [0, 10, 1020, 1030]


def test_none_collected_results_stay_remote_and_arrive_as_a_list(run):
    producer, consumer = run["producer"], run["consumer"]
    placeholder = _workers(consumer).resolve_argument(producer.tag(), PreparedCall("m"))
    assert isinstance(placeholder, list) and all(isinstance(p, RemoteValue) for p in placeholder)
    assert consumer.tags(producer.tag())() == [["p0", "p1"], ["p0", "p1"]]


def test_chaining_into_a_group_of_another_size_and_other_collectors(run):
    producer = run["producer"]
    # A second class on the one-worker loader group (colocated with Batches): its single
    # worker's share spans both producer results.
    single = Consumer(1.0, remote_group="loader")
    assert single.shift(producer.square(np.arange(5)))().tolist() == [0, 1, 4, 9, 16]
    # A sum of numbers is combined on the consumer.
    assert single.plus(producer.total(np.arange(5)))() == ["float", 11.0]
    assert isinstance(
        _workers(single).resolve_argument(producer.total([1, 2]), PreparedCall("m")),
        RemoteCollected,
    )


def test_a_small_argument_shared_by_every_worker_travels_inline_as_raw_ray_sends_it():
    per_worker = [(({"lr": 0.1, "ids": list(range(10))}, np.zeros(8), b"x" * 1024), {})] * 4
    shipper = Shipper(per_worker)
    shipped = [shipper.ship_call(a, k) for a, k in per_worker]
    assert shipper.puts == 0 and shipped[0][0][0] is per_worker[0][0][0]
    big = [((np.zeros(200_000),), {})] * 4  # 1.6 MB: one put, shared
    shipper = Shipper(big)
    refs = [shipper.ship_call(a, k)[0][0] for a, k in big]
    assert shipper.puts == 1 and len({r.hex() for r in refs}) == 1


@pytest.mark.parametrize(
    ("shape", "puts"),
    [
        ("the same small args", 0),  # dispatch='all' with a config dict: the short road
        ("the same args, one large", 1),
        ("the same args, keywords too", 1),
        ("equal args, not the same tuple", 1),
    ],
)
def test_ship_all_puts_each_large_shared_value_once_whatever_the_shape(run, shape, puts):
    """`ship_all`'s short road (every worker the very same small arguments) gives what the
    `Shipper` gives: the arguments as they are; any other shape goes through the `Shipper`."""
    small, large = {"lr": 0.1, "step": 3}, np.zeros(200_000)  # large: 1.6 MB
    same = (small, large) if shape != "the same small args" else (small,)
    if shape == "equal args, not the same tuple":
        calls = [WorkerCall(r, (small, large), {}) for r in range(4)]
    else:
        kwargs = {"x": 1} if shape == "the same args, keywords too" else {}
        calls = [WorkerCall(r, same, dict(kwargs)) for r in range(4)]
    shipped = ship_all(calls)
    assert [k for _, k in shipped] == [c.kwargs for c in calls]
    assert all(a[0] is small for a, _ in shipped)  # small values travel as they are
    refs = {a[1].hex() for a, _ in shipped if len(a) > 1}
    assert len(refs) == puts  # the large one: put once, the same ref for every worker
    if puts == 0:
        assert all(a is same for a, _ in shipped)


def test_a_shard_shared_by_peers_is_put_once_and_both_receive_it():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    batch = {"x": np.arange(2 * 20_000)}  # 160 KB per shard: above the inline size
    per_worker = SliceDPDispatcher().dispatch((batch,), {}, 4, mesh)
    shipper = Shipper(per_worker)
    shipped = [shipper.ship_call(a, k) for a, k in per_worker]
    # tp peers (workers 0,1 and 2,3) share a shard: one object-store entry per shard.
    assert shipper.puts == 2
    assert shipped[0][0][0] is shipped[1][0][0] and shipped[2][0][0] is shipped[3][0][0]
    assert shipped[0][0][0] != shipped[2][0][0]


@settings(max_examples=30, deadline=None)
@given(
    total=st.integers(1, 40),
    start=st.integers(0, 40),
    length=st.integers(0, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.float16]),
)
def test_tensor_views_travel_with_only_their_own_bytes(total, start, length, dtype):
    base = torch.arange(total * 3, dtype=torch.float32).reshape(total, 3).to(dtype)
    view = base[start : start + length]
    packed = tensor_to_numpy(view)
    buffers: list = []
    pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    # Out-of-band buffers hold the view's bytes only, never the base storage.
    assert sum(memoryview(b).nbytes for b in buffers) == view.numel() * view.element_size()
    back = tensor_from_numpy(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert back.dtype == view.dtype and back.shape == view.shape
    assert torch.equal(back, view)


def test_tensors_round_trip_through_workers(run):
    consumer = run["consumer"]
    t = torch.linspace(0, 1, 12, dtype=torch.bfloat16).reshape(3, 4)[1:]
    t.requires_grad_(True)
    info = consumer.tensor_info(t)()
    expected = float(t.detach().float().sum())
    assert info == ["torch.bfloat16", [2, 4], True, pytest.approx(expected, 1e-2)]


def test_tensor_results_come_back_as_tensors(run):
    rows = run["consumer"].tensor_rows(2)()
    assert isinstance(rows, torch.Tensor) and rows.dtype == torch.float64
    assert rows[:, 0].tolist() == [0.0, 10.0, 100.0, 110.0]
    rows += 1  # the driver gets writable tensors


def test_iteration_restarts_and_ends(run):
    batches = run["batches"]
    first = [b["step"] for b in batches]
    second = [int(b["x"][0]) for b in batches]
    assert first == [1, 2, 3] and second == [1, 2, 3]


def test_sync_waits_for_every_worker(run):
    result = run["producer"].slow_mark(0.5)
    assert result.done() and result() == [0, 1]


def test_worker_environment_and_secrets(run):
    envs = run["producer"].environment(ENV_NAMES)()
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] is not None and int(env["LOCAL_WORLD_SIZE"]) >= 1
        assert env["MASTER_ADDR"] and int(env["MASTER_PORT"]) > 0
        assert env["TWINKLE_TEST_FLAG"] == "on" and env["MYAPP_SETTING"] == "42"
        assert env["TW_TEST_SECRET"] is None
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_device_placement_shows_nodes_and_ranks(run):
    text = get_device_placement(detail=True)
    assert "mode ray" in text and "(connected)" in text and "nodes 2" in text
    for p in _workers(run["producer"]).placements:
        assert p.node and p.node in text
    assert "class Batches" in text and twinkle_core.is_initialized()
