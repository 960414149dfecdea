"""Mode 'local' without torchrun: one process, world size 1, no process group.

Also the checks made at `initialize` (before any process could wait on another), and the
parsing of torchrun's environment.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    NotInitializedError,
    TwinkleError,
    get_device_placement,
    get_worker_context,
    initialize,
    is_initialized,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.runtime import current_runtime
from twinkle_local.env import TorchrunEnv

from .conftest import JOBS

pytestmark = pytest.mark.usefixtures("single_process")


def _load_scenarios():
    spec = importlib.util.spec_from_file_location(
        "twinkle_local_test_scenarios", JOBS / "scenarios.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pickling its namedtuple needs the module importable
    spec.loader.exec_module(module)
    return module


@remote_class()
class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    @remote_function(dispatch="all", collect="sum")
    def add(self, n):
        self.value += n
        return self.value

    @remote_function(dispatch="all", collect="first")
    def where(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.world_size, ctx.local_rank, ctx.group_name, ctx.device_type]

    @remote_function(dispatch="all", collect="mean")
    def fail(self):
        raise KeyError("missing column")


def test_scenarios_match_inprocess_on_one_worker():
    scenarios = _load_scenarios()
    reference = scenarios.run("inprocess", size=1)
    assert scenarios.run("local", size=1) == reference
    assert reference["context"] == [[0, 1, 0, 1, "w", "cpu", [0], 0, 1, {"dp": 1}]]


@pytest.mark.parametrize("mode", ["local", "torchrun"])
def test_default_group_is_one_process(mode):
    config = initialize(mode, seed=5)
    try:
        assert not dist.is_initialized()  # a lone process needs no process group
        assert list(config.groups) == ["default"]
        group = config.groups["default"]
        assert (group.num_workers, group.device_type) == (1, "cpu")
        assert config.global_device_mesh == DeviceMesh.from_sizes(dp_size=1)
        counter = Counter(10, remote_group="default")
        assert counter.add(5)() == 15
        assert counter.add(1)() == 16
        assert counter.where()() == [0, 1, 0, "default", "cpu"]
        assert get_worker_context() is None  # the driver is not a worker
        assert "mode " + mode in get_device_placement(detail=True)
        assert current_runtime().backend.describe()["world"] == 1
    finally:
        shutdown()
    assert not is_initialized()
    with pytest.raises(NotInitializedError, match="was shut down"):
        counter.add(1)  # the workers are gone with the run


def test_failure_names_the_call_site_and_notifies_once():
    alerts: list[str] = []
    initialize("local", notifier=alerts.append)
    try:
        counter = Counter(0, remote_group="default")
        for _ in range(2):
            with pytest.raises(KeyError) as info:
                counter.fail()()  # the same failure twice
            # A KeyError keeps its key; the call site is a note.
            assert info.value.args == ("missing column",)
            assert f"{__file__}:" in "\n".join(info.value.__notes__)
    finally:
        shutdown()
    assert len(alerts) == 1 and "KeyError" in alerts[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"groups": [DeviceGroup("big", 2, "cpu")]}, r"'big' has 2 workers .*--nproc_per_node"),
        ({"global_device_mesh": DeviceMesh.from_sizes(dp_size=4)}, r"needs 4 workers"),
        ({"nproc_per_node": 2}, r"nproc_per_node=2.*torchrun decides"),
        ({"groups": [DeviceGroup("gpus", 1, "GPU")]}, r"device_type 'cuda'.*sees no such device"),
        ({"speed": "fast"}, r"unknown options \['speed'\].*timeout, dist_timeout, isolate"),
        ({"timeout": 0}, r"timeout=\.\.\.\) must be a positive number"),
        ({"dist_timeout": -5}, r"dist_timeout=\.\.\.\) must be a positive number"),
        ({"isolate": "yes"}, r"isolate=\.\.\.\) must be True or False"),
        ({"node_sockets": 1}, r"node_sockets=\.\.\.\) must be True or False, got 1"),
        ({"dist_backend": 3}, r"dist_backend=\.\.\.\) must be"),
    ],
)
def test_bad_setup_fails_at_initialize(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        initialize("local", **kwargs)
    assert not is_initialized()


def test_partial_torchrun_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigurationError, match="not both WORLD_SIZE and RANK"):
        initialize("local")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigurationError, match="MASTER_ADDR and MASTER_PORT not set"):
        initialize("local")
    assert not is_initialized()


def _env(world, rank, local_world, local_rank):
    return {
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }


@st.composite
def torchrun_layouts(draw):
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(1, 8))
    rank = draw(st.integers(0, nodes * per_node - 1))
    return nodes * per_node, rank, per_node, rank % per_node


@given(torchrun_layouts())
def test_torchrun_environment_round_trips(layout):
    world, rank, local_world, local_rank = layout
    env = TorchrunEnv.from_environ(_env(world, rank, local_world, local_rank))
    assert env.launched
    assert (env.world_size, env.rank, env.local_world_size, env.local_rank) == layout
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29500)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"RANK": "2"}, r"RANK=2 must be below WORLD_SIZE=2"),
        ({"WORLD_SIZE": "two"}, r"WORLD_SIZE='two' must be an integer >= 1"),
        ({"LOCAL_RANK": "-1"}, r"LOCAL_RANK='-1' must be an integer >= 0"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 must be below LOCAL_WORLD_SIZE=2"),
        ({"MASTER_PORT": "0"}, r"MASTER_PORT='0' must be an integer >= 1"),
    ],
)
def test_bad_torchrun_environment(override, match):
    with pytest.raises(ConfigurationError, match=match):
        TorchrunEnv.from_environ({**_env(2, 1, 2, 1), **override})


def test_no_torchrun_environment_is_a_lone_process():
    env = TorchrunEnv.from_environ({"PATH": "/bin"})
    assert not env.launched
    assert (env.world_size, env.rank, env.local_rank, env.local_world_size) == (1, 0, 0, 1)


def test_a_group_the_user_started_without_torchrun_variables():
    """E.g. SLURM scripts that call init_process_group themselves: that world is used."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        initialize("local", groups=[DeviceGroup("g", 1, "cpu")])
        try:
            backend = current_runtime().backend
            assert backend.session.env.launched and backend.session.channel.distributed
            counter = Counter(1, remote_group="g")
            assert counter.add(2)() == 3
            assert backend.claim_notification("some failure") is True  # through the store
            assert backend.claim_notification("some failure") is False
        finally:
            shutdown()
        assert dist.is_initialized()  # not twinkle's to destroy
    finally:
        dist.destroy_process_group()


def test_simulated_gpu_machine(fake_cuda):
    """Detection drives the default group, the local device and the worker context."""
    config = initialize("local", seed=3)
    try:
        assert config.groups["default"].device_type == "cuda"
        assert fake_cuda.current == [0]  # LOCAL_RANK 0 made current
        counter = Counter(0, remote_group="default")
        assert counter.where()() == [0, 1, 0, "default", "cuda"]
        assert "device cuda:0" in get_device_placement(detail=True)
        assert current_runtime().backend.describe()["device"] == "cuda"
    finally:
        shutdown()
    assert fake_cuda.seeds and set(fake_cuda.seeds) == {3}


def test_reduced_calls_have_no_per_rank_list():
    initialize("local")
    try:
        counter = Counter(1, remote_group="default")
        lazy = counter.add(1)  # collect="sum": all-reduced, per-rank results not exchanged
        assert lazy() == 2
        with pytest.raises(TwinkleError, match=r"all-reduce.*collect='none'"):
            lazy.source.pending.wait(None)
        assert counter.where()() == [0, 1, 0, "default", "cpu"]
    finally:
        shutdown()


def test_full_determinism_reaches_the_workers(monkeypatch):
    import torch

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()

    @remote_class()
    class Probe:
        def __init__(self) -> None:
            pass

        @remote_function(dispatch="all", collect="first")
        def state(self):
            import os

            return [
                torch.are_deterministic_algorithms_enabled(),
                os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            ]

    initialize("local", full_determinism=True)
    try:
        assert Probe(remote_group="default").state()() == [True, ":4096:8"]
    finally:
        shutdown()
        torch.use_deterministic_algorithms(before)
        torch.backends.cudnn.deterministic = False


@remote_class(colocate=False)
class OwnProcesses:
    def __init__(self):
        self.x = 1


def test_colocate_false_is_refused_under_torchrun_naming_the_fix():
    """torchrun's processes are fixed at launch: every object of a rank shares its one."""
    initialize("local", groups=[DeviceGroup("g", 1, "cpu")])
    try:
        with pytest.raises(ConfigurationError) as info:
            OwnProcesses(remote_group="g")
    finally:
        shutdown()
    text = str(info.value)
    assert "OwnProcesses" in text and "colocate=False" in text and "mode 'ray'" in text


def test_roles_take_turns_under_torchrun_as_in_process():
    """The same offload()/onload() switches as tests/core/test_swapping.py, in mode 'local'."""
    from core import test_swapping as swapping

    swapping.ON_DEVICE.clear()
    swapping.EVENTS.clear()
    initialize("local", groups=[DeviceGroup("g", 1, "cpu")])
    try:
        swapped = swapping._interleaved(swapping.Role)
        plain = swapping._interleaved(swapping.Plain)
    finally:
        shutdown()
    assert swapped == plain
    assert swapping.EVENTS[:4] == [
        "off:policy:0",
        "off:reference:0",
        "off:sampler:0",
        "on:policy:0",
    ]
    assert len(swapping.EVENTS) == 2 + 9 * 2 + 1


def test_local_mode_outside_torchrun_says_so_once_and_in_the_placement(single_process, caplog):
    import logging

    from twinkle_core import get_device_placement

    caplog.set_level(logging.WARNING, logger="twinkle")
    initialize("local", groups=[DeviceGroup("g", 1, "cpu")])
    try:
        lines = [m for m in caplog.messages if "outside torchrun" in m]
        assert len(lines) == 1 and "torchrun --nproc_per_node=N" in lines[0]
        assert "launched no (a single process)" in get_device_placement(detail=True)
    finally:
        shutdown()


@remote_class()
class _Generation:
    @remote_function(dispatch="all", collect="first")
    def generation(self):
        from twinkle_core import get_worker_context

        return get_worker_context().generation


def test_the_generation_under_torchrun_is_its_restart_count(single_process, monkeypatch):
    """torchrun --max-restarts restarts the whole job: its workers say which attempt they are
    (issue 28, item 5), as a restarted Ray group says its generation."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    initialize("local", groups=[DeviceGroup("g", 1, "cpu")])
    try:
        assert _Generation(remote_group="g").generation()() == 2
    finally:
        shutdown()
