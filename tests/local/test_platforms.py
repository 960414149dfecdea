"""The torch platforms: detection, aliases, environment mapping and seeding.

This machine has no GPU or NPU. Where a test needs one, only the hardware probe is faked
(`torch.cuda.is_available`/`device_count`, or a stand-in `torch_npu` module that records what it
is asked); the platform code paths run for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core.plugin import AcceleratorPlatform, detect_platform, get_platform
from twinkle_local.platforms import CudaPlatform, MpsPlatform, NpuPlatform, TorchCpuPlatform
from twinkle_local.seeding import get_torch_rng_state, seed_torch, set_torch_rng_state


class FakeNpuApi:
    """What `torch_npu.npu` offers, for a machine without Ascend hardware; records its calls."""

    def __init__(self, count: int = 8, broken: bool = False) -> None:
        self.count = count
        self.broken = broken
        self.calls: list[tuple] = []
        self.state = torch.tensor([0], dtype=torch.uint8)

    def is_available(self) -> bool:
        if self.broken:
            raise RuntimeError("driver not loaded")
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index))

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", seed))
        self.state = torch.tensor([seed % 256], dtype=torch.uint8)

    def get_rng_state_all(self):
        return [self.state.clone()]

    def set_rng_state_all(self, states) -> None:
        self.calls.append(("set_rng_state_all", int(states[0][0])))
        self.state = states[0].clone()


@pytest.fixture
def fake_npu(monkeypatch):
    api = FakeNpuApi()
    module = types.ModuleType("torch_npu")
    module.npu = api
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return api


# --------------------------------------------------------------------------- static description


def test_static_attributes_need_no_torch(tmp_path):
    """Listing plugins and reading platform attributes must not import torch (Ray planning)."""
    code = textwrap.dedent(
        """
        import json, sys
        from twinkle_core.plugins import plugin_system
        system = plugin_system()
        out = {}
        for name in system.names("platforms"):
            cls = system.get("platforms", name)
            out[name] = [cls.visible_devices_env, cls.ray_resource, cls.dist_backend,
                         list(cls.ray_noset_env_vars), cls.detection_priority]
        import twinkle_local, twinkle_local.backend  # noqa: E401, F401
        out["backends"] = system.names("backends")
        out["torch_imported"] = "torch" in sys.modules
        print(json.dumps(out))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # not the repo root: its source folders would shadow the installed packages
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out.pop("torch_imported") is False
    assert {"local", "torchrun", "inprocess"} <= set(out.pop("backends"))
    assert out["cuda"] == [
        "CUDA_VISIBLE_DEVICES",
        "GPU",
        "nccl",
        ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"],
        100,
    ]
    assert out["npu"] == [
        "ASCEND_RT_VISIBLE_DEVICES",
        "NPU",
        "hccl",
        ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"],
        90,
    ]
    assert out["mps"] == [None, None, "gloo", [], 50]
    assert out["cpu"] == [None, "CPU", "gloo", [], 0]


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("cuda", CudaPlatform),
        ("GPU", CudaPlatform),
        ("Cuda", CudaPlatform),
        ("nvidia", CudaPlatform),
        ("npu", NpuPlatform),
        ("Ascend", NpuPlatform),
        ("NPU", NpuPlatform),
        ("mps", MpsPlatform),
        ("cpu", TorchCpuPlatform),
        ("CPU", TorchCpuPlatform),
        ("host", TorchCpuPlatform),
    ],
)
def test_names_and_aliases_are_case_insensitive(name, cls):
    assert type(get_platform(name)) is cls


def test_torch_cpu_replaces_core_cpu():
    platform = get_platform("cpu")
    assert isinstance(platform, TorchCpuPlatform)
    assert platform.local_device() == torch.device("cpu")
    assert platform.device_count() == (os.cpu_count() or 1)


@given(st.lists(st.integers(min_value=0, max_value=63), min_size=1, max_size=16, unique=True))
def test_visible_devices_environment_round_trips(device_ids):
    for platform, var in (
        (CudaPlatform(), "CUDA_VISIBLE_DEVICES"),
        (NpuPlatform(), "ASCEND_RT_VISIBLE_DEVICES"),
    ):
        env = platform.visible_devices_environment(device_ids)
        assert list(env) == [var]
        assert [int(x) for x in env[var].split(",")] == device_ids
    assert MpsPlatform().visible_devices_environment(device_ids) == {}
    assert TorchCpuPlatform().visible_devices_environment(device_ids) == {}


# --------------------------------------------------------------------------- detection


def test_this_machine_detects_cpu():
    assert not CudaPlatform.is_available() and CudaPlatform.device_count() == 0
    assert not NpuPlatform.is_available() and NpuPlatform.device_count() == 0
    assert not MpsPlatform.is_available() and MpsPlatform.device_count() == 0
    assert isinstance(detect_platform(), TorchCpuPlatform)


def test_simulated_cuda_is_detected_first(fake_cuda, fake_npu, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    platform = detect_platform()
    assert isinstance(platform, CudaPlatform)
    assert platform.device_count() == 4
    assert platform.local_device(3) == torch.device("cuda", 3)


def test_simulated_npu_beats_mps_and_cpu(fake_npu, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    platform = detect_platform()
    assert isinstance(platform, NpuPlatform)
    assert platform.device_count() == 8
    platform.set_device(5)
    assert fake_npu.calls == [("set_device", 5)]


def test_simulated_mps_beats_cpu(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert isinstance(detect_platform(), MpsPlatform)
    assert MpsPlatform.device_count() == 1


def test_detection_never_crashes(monkeypatch):
    api = FakeNpuApi(broken=True)
    module = types.ModuleType("torch_npu")
    module.npu = api
    monkeypatch.setitem(sys.modules, "torch_npu", module)

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    monkeypatch.setattr(torch.backends.mps, "is_available", broken)
    assert not CudaPlatform.is_available() and CudaPlatform.device_count() == 0
    assert not NpuPlatform.is_available() and NpuPlatform.device_count() == 0
    assert not MpsPlatform.is_available()
    assert isinstance(detect_platform(), TorchCpuPlatform)


def test_npu_module_without_npu_api_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    assert not NpuPlatform.is_available()


def test_platforms_are_accelerator_platforms():
    for cls in (CudaPlatform, NpuPlatform, MpsPlatform, TorchCpuPlatform):
        assert issubclass(cls, AcceleratorPlatform)


# --------------------------------------------------------------------------- seeding


def test_seed_torch_repeats_draws():
    seed_torch(123)
    first = torch.rand(4)
    seed_torch(123)
    assert torch.equal(torch.rand(4), first)
    seed_torch(124)
    assert not torch.equal(torch.rand(4), first)


def test_rng_state_round_trip():
    seed_torch(5)
    state = get_torch_rng_state()
    assert set(state) == {"torch"}
    a = torch.rand(3)
    set_torch_rng_state(state)
    assert torch.equal(torch.rand(3), a)


def test_seed_and_state_cover_simulated_cuda(fake_cuda):
    seed_torch(77)
    assert fake_cuda.seeds and set(fake_cuda.seeds) == {77}
    state = get_torch_rng_state()
    assert set(state) == {"torch", "torch_cuda"}
    assert [int(s[0]) for s in state["torch_cuda"]] == [77] * 4
    fake_cuda.manual_seed_all(3)
    set_torch_rng_state(state)
    assert [int(s[0]) for s in fake_cuda.states] == [77] * 4


def test_seed_and_state_cover_simulated_npu(fake_npu):
    seed_torch(9)
    state = get_torch_rng_state()
    assert ("manual_seed_all", 9) in fake_npu.calls
    assert int(state["torch_npu"][0][0]) == 9
    set_torch_rng_state(state)
    assert fake_npu.calls[-1] == ("set_rng_state_all", 9)


def test_full_determinism(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("HCCL_DETERMINISTIC", "user-choice")
    before = torch.are_deterministic_algorithms_enabled()
    try:
        seed_torch(1, full_determinism=False)
        assert torch.are_deterministic_algorithms_enabled() == before
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        seed_torch(1, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert os.environ["HCCL_DETERMINISTIC"] == "user-choice"  # the user's value wins
    finally:
        torch.use_deterministic_algorithms(before)
        torch.backends.cudnn.deterministic = False


def test_inprocess_workers_get_their_own_torch_generator():
    """Through core's hooks, each simulated worker draws as a fresh seeded process would."""
    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

    @remote_class()
    class Drawer:
        def __init__(self) -> None:
            self.at_init = float(torch.rand(1))

        @remote_function(dispatch="all", collect="none")
        def draw(self):
            return [self.at_init, float(torch.rand(1))]

    initialize("inprocess", seed=31, groups=[DeviceGroup("g", 2, "cpu")])
    try:
        driver_next = torch.get_rng_state()
        drawer = Drawer(remote_group="g")
        first = drawer.draw()()
        second = drawer.draw()()
        assert torch.equal(torch.get_rng_state(), driver_next)  # workers never touch the driver's
    finally:
        shutdown()
    torch.manual_seed(31)
    expected = [float(torch.rand(1)) for _ in range(3)]
    assert first == [expected[:2], expected[:2]]  # same seed in each worker, separate streams
    assert second == [[expected[0], expected[2]], [expected[0], expected[2]]]
