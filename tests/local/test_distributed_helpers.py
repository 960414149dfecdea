"""`twinkle_core.init_distributed` (answered by twinkle-local from torchrun's environment) and
`to_torch_device_mesh` in a real one-process gloo world.

Multi-rank meshes are checked inside the torchrun job of test_torchrun.py.
"""

from __future__ import annotations

import datetime
import sys
import types

import pytest
import torch
import torch.distributed as dist
from _support.net import free_port

from twinkle_core import ConfigurationError, DeviceMesh, init_distributed
from twinkle_core.plugin import as_timeout
from twinkle_local import to_torch_device_mesh


@pytest.fixture
def one_process_world(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_mesh_needs_an_initialized_world():
    assert not dist.is_initialized()
    with pytest.raises(ConfigurationError, match="init_distributed"):
        to_torch_device_mesh(DeviceMesh.from_sizes(dp_size=1), "cpu")


def test_init_and_convert(one_process_world):
    assert init_distributed("cpu", timeout=60) is True
    assert dist.get_backend() == "gloo"
    assert init_distributed("cpu") is False  # already initialized: left alone

    mesh = to_torch_device_mesh(DeviceMesh.from_sizes(dp_size=1), "cpu")
    assert mesh.device_type == "cpu"
    assert mesh.mesh_dim_names == ("dp",)  # a one-rank mesh keeps its data dimension
    assert mesh.mesh.tolist() == [0]

    full = to_torch_device_mesh(DeviceMesh.from_sizes(dp_size=1), "cpu", keep_size_one=True)
    assert full.mesh_dim_names == ("pp", "dp", "fsdp", "ep", "cp", "tp")
    assert tuple(full.mesh.shape) == (1,) * 6

    with pytest.raises(ConfigurationError, match="world has 1 processes"):
        to_torch_device_mesh(DeviceMesh.from_sizes(dp_size=2), "cpu")
    with pytest.raises(ConfigurationError, match=r"mesh=.*twinkle_core\.DeviceMesh"):
        to_torch_device_mesh([[0]], "cpu")


def test_init_sets_the_accelerator_device_first(one_process_world, monkeypatch):
    """On an (simulated) NPU the local device is made current before the group starts."""
    calls = []
    api = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        set_device=lambda i: calls.append(i),
    )
    module = types.ModuleType("torch_npu")
    module.npu = api
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setenv("LOCAL_RANK", "1")
    # hccl needs the real hardware; the device handling is what is checked here.
    assert init_distributed("ascend", backend="gloo", timeout=datetime.timedelta(seconds=30))
    assert calls == [1]
    assert dist.get_backend() == "gloo"


@pytest.mark.parametrize("bad", [0, -1, "10", True, None])
def test_bad_timeout_is_a_clear_error(bad):
    with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
        as_timeout(bad)


def test_timeout_accepts_seconds_and_timedelta():
    assert as_timeout(2.5) == datetime.timedelta(seconds=2.5)
    assert as_timeout(datetime.timedelta(minutes=1)) == datetime.timedelta(seconds=60)
    assert torch.distributed.is_available()


def test_simulated_gpus_get_nccl_and_their_device(one_process_world, monkeypatch):
    """Auto-detected cuda: the device is set, then nccl is asked for (CPU torch has none)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(i))
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(RuntimeError, match="NCCL"):
        init_distributed()
    assert calls == [3]
    assert not dist.is_initialized()


@pytest.mark.filterwarnings("ignore:Device capability of hccl unknown")
def test_simulated_npus_get_hccl(one_process_world, monkeypatch):
    module = types.ModuleType("torch_npu")
    module.npu = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 8, set_device=lambda i: None
    )
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    with pytest.raises(Exception, match="hccl"):  # this torch has no hccl registered
        init_distributed()
    assert not dist.is_initialized()
