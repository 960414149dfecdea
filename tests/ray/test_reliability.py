"""Reliability and safety under faults and bad input: requests larger than the machine fail at
`initialize` with the numbers, and arguments Ray cannot ship fail early, named, without their
values (twinkle's temp dirs being private is tested in test_embedded.py)."""

from __future__ import annotations

import glob
import os
import sys
import threading
import time

import pytest
import ray
import ray.cloudpickle

import twinkle_core
from twinkle_core import ConfigurationError, DeviceGroup, initialize
from twinkle_core.plugin import WorkerCall
from twinkle_ray.options import RayOptions
from twinkle_ray.payload_check import checked_arguments
from twinkle_ray.resources import (
    WORKER_MEMORY_MIB,
    ClusterResourceError,
    MachineCapacity,
    embedded_cluster_cpus,
    machine_capacity,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _children() -> set[int]:
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


# ----------------------------------------------------------------------- resources
def test_embedded_group_larger_than_the_machine_fails_fast_with_the_numbers(no_runtime):
    if ray.is_initialized():
        ray.shutdown()  # a connection left by another module would make this a connected run
    before_dirs = set(glob.glob("/tmp/tw-ray-*"))
    before_children = _children()
    machine = machine_capacity()
    start = time.monotonic()
    with pytest.raises(ClusterResourceError) as info:
        initialize("ray", groups=[DeviceGroup("g", 64, "cpu")], name="too-many-workers")
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert "64 worker process(es)" in message and "'g': 64 x 1 CPU" in message
    assert f"{WORKER_MEMORY_MIB} MiB per idle worker" in message
    assert f"this machine has {machine.cpus} CPU cores" in message
    assert "num_cpus=64" in message and "oversubscribe=True" in message
    assert "cpus_per_worker=" in message
    # Nothing was started, nothing is left.
    assert not twinkle_core.is_initialized() and not ray.is_initialized()
    assert set(glob.glob("/tmp/tw-ray-*")) <= before_dirs
    assert _children() <= before_children


def _cpus(groups, cpw=1.0, **kw):
    return embedded_cluster_cpus(
        {g.name: g for g in groups},
        lambda name: cpw,
        num_cpus=kw.pop("num_cpus", None),
        oversubscribe=kw.pop("oversubscribe", False),
        **kw,
    )


def test_embedded_capacity_checks_and_how_to_ask_anyway():
    small = MachineCapacity(cpus=2, available_mib=2048, total_mib=4096)
    # A few one-CPU workers on a small machine still start (tests, examples, laptops).
    assert _cpus([DeviceGroup("g", 3, "cpu")], machine=small) == 3
    # Memory: 10 workers x 280 MiB + Ray's own do not fit 2 GiB, whatever the CPUs say.
    with pytest.raises(ClusterResourceError, match=r"more than the 2\.0 GiB of memory available"):
        _cpus([DeviceGroup("g", 10, "cpu")], cpw=0.1, machine=small)
    with pytest.raises(ClusterResourceError, match=r"more than 4 x its 2 cores \(8\)"):
        _cpus([DeviceGroup("g", 9, "cpu")], machine=MachineCapacity(2, 64000, 64000))
    big = MachineCapacity(2, 64000, 64000)
    # Ways to ask for it anyway: fractions, an explicit size, or oversubscribe.
    assert _cpus([DeviceGroup("g", 64, "cpu")], cpw=0.12, machine=big) == 8
    assert _cpus([DeviceGroup("g", 64, "cpu")], num_cpus=64, machine=big) == 64
    assert _cpus([DeviceGroup("g", 64, "cpu")], oversubscribe=True, machine=small) == 64
    # Accelerator workers count as processes for memory.
    with pytest.raises(ClusterResourceError, match=r"'m': 8 x cuda worker"):
        _cpus([DeviceGroup("m", 8, "cuda")], machine=MachineCapacity(64, 1024, 1024))


def test_oversubscribe_option_is_validated():
    assert RayOptions.parse({"oversubscribe": True}).oversubscribe is True
    with pytest.raises(ConfigurationError, match=r"oversubscribe=\.\.\.\) must be True or False"):
        RayOptions.parse({"oversubscribe": "yes"})


# ----------------------------------------------------------------------- payloads
def _secret_lambda():
    secret = "SECRET-123"
    lock = threading.Lock()
    return lambda: (secret, lock)


@ray.remote(num_cpus=0)
class _Sink:
    def take(self, *args, **kwargs):
        return len(args) + len(kwargs)


@pytest.fixture
def sink(cluster):
    ray.init(address=cluster.address)
    try:
        yield _Sink.remote()
    finally:
        ray.shutdown()


def _submit(sink, *args, **kwargs):
    calls = [WorkerCall(0, args, kwargs), WorkerCall(1, args, kwargs)]
    with checked_arguments("Worker", "step", calls):
        return ray.get([sink.take.remote(*c.args, **c.kwargs) for c in calls])


def test_unpicklable_closure_is_named_without_its_values(sink):
    fn = _secret_lambda()
    with pytest.raises(TypeError):  # Ray's own message: kilobytes about the closure
        ray.get(sink.take.remote(fn))
    with pytest.raises(ConfigurationError) as info:
        _submit(sink, 1, fn)
    message = str(info.value)
    assert "Worker.step: argument 1 (function)" in message and "_thread.lock" in message
    assert "SECRET-123" not in message and len(message) < 400
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(ConfigurationError, match=r"keyword argument 'hook' \(function\)"):
        _submit(sink, hook=fn)


def test_open_file_is_refused_not_sent_as_a_copy(sink, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("SECRET-123 contents")
    with open(path) as f:
        assert ray.get(sink.take.remote(f)) == 1  # Ray alone sends it (as a StringIO copy)
        with pytest.raises(ConfigurationError) as info:
            _submit(sink, f)
        message = str(info.value)
        assert "Worker.step: argument 0 is an open file (_io.TextIOWrapper)" in message
        assert "pass its path" in message and "SECRET" not in message
        with pytest.raises(ConfigurationError, match=r"keyword argument 'files'\[1\]"):
            _submit(sink, files=["a", f])
    # Plain data, in-memory streams and other errors pass through untouched.
    import io

    assert _submit(sink, 1, "x", buf=io.BytesIO(b"x")) == [3, 3]
    with pytest.raises(ZeroDivisionError):
        with checked_arguments("Worker", "step", [WorkerCall(0, (1,), {})]):
            1 / 0  # noqa: B018


def test_process_bound_parts_are_found_by_path_inside_containers():
    """The path to a lock inside containers names keys that look like names and list/tuple
    indexes; sets add no index; data-like keys show as [...]; nothing past the scan's depth or
    item limit is looked at, and plain config dicts pass."""
    from twinkle_ray.payload_check import SCAN_DEPTH, SCAN_ITEMS, check_arguments

    lock = threading.Lock()

    def where(*args, **kwargs) -> str:
        with pytest.raises(ConfigurationError) as info:
            check_arguments("W", "m", args, kwargs)
        return str(info.value).split(" is ")[0]

    assert where({"opt": {"lock": lock}}) == "W.m: argument 0['opt']['lock']"
    assert where(1, cfg=[0, (5, lock)]) == "W.m: keyword argument 'cfg'[1][1]"
    assert where({"a b/c": [lock]}) == "W.m: argument 0[...][0]"
    assert where({7: {lock}}) == "W.m: argument 0[7]"
    assert where([{"x": 1}, lock]) == "W.m: argument 0[1]"
    deep = lock
    for _ in range(SCAN_DEPTH + 1):
        deep = [deep]
    check_arguments("W", "m", (deep, [0] * SCAN_ITEMS + [lock]), {})  # not looked at
    check_arguments("W", "m", ({"step": 3, "lr": 1e-4, "tags": ["a", "b"]},), {"n": 2})
