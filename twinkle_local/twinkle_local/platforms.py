"""The torch accelerator platforms: cuda, npu, mps and a torch-aware cpu.

Class attributes describe each platform statically, so a driver (the Ray backend planning
placement, `twinkle plugins`) can read them without importing torch. The probing methods import
torch (and `torch_npu` for Ascend) on first use and never raise when the hardware or its library
is absent: a machine without a GPU simply reports `is_available() == False`.

Detection order (`twinkle_core.detect_platform`): cuda (100) > npu (90) > mps (50) > cpu (0).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

from twinkle_core.plugin import AcceleratorPlatform, CpuPlatform

log = logging.getLogger("twinkle")


_torch_installed: bool | None = None  # find_spec is a filesystem search: ask once


def torch_installed() -> bool:
    """Whether torch can be imported here, without importing it."""
    global _torch_installed
    if "torch" in sys.modules:
        return True
    if _torch_installed is None:
        _torch_installed = importlib.util.find_spec("torch") is not None
    return _torch_installed


def torch_or_none() -> ModuleType | None:
    """The torch module, imported on first use; None when torch is not installed."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if not torch_installed():
        return None
    try:
        return importlib.import_module("torch")
    except Exception as exc:  # a broken torch install must not break detection
        log.debug("twinkle: torch could not be imported: %s", exc)
        return None


_torch_npu_installed: bool | None = None  # find_spec is a filesystem search: ask once


def torch_npu_or_none() -> ModuleType | None:
    """The `torch_npu` module when installed (importing it registers `torch.npu`), else None."""
    global _torch_npu_installed
    module = sys.modules.get("torch_npu")
    if module is not None:
        return module
    try:
        if _torch_npu_installed is None:
            _torch_npu_installed = importlib.util.find_spec("torch_npu") is not None
        if not _torch_npu_installed:
            return None
        return importlib.import_module("torch_npu")
    except Exception as exc:
        log.debug("twinkle: torch_npu could not be imported: %s", exc)
        return None


def _torch_device(device_type: str, index: int | None) -> Any:
    """`torch.device(device_type, index)`, or the string form when torch cannot build it."""
    torch = torch_or_none()
    text = device_type if index is None else f"{device_type}:{int(index)}"
    if torch is None:
        return text
    try:
        return torch.device(text)
    except (RuntimeError, ValueError):
        return text


class TorchAcceleratorPlatform(AcceleratorPlatform):
    """An accelerator whose torch module has the `torch.cuda` API (`is_available`,
    `device_count`, `set_device`, `manual_seed_all`, `get/set_rng_state_all`): cuda and npu.

    A subclass names its module (`_accelerator()`); everything else is shared.
    """

    @classmethod
    def _accelerator(cls) -> Any | None:
        """The device module (`torch.cuda`, `torch_npu.npu`); None when it is absent."""
        return None

    @classmethod
    def is_available(cls) -> bool:
        try:
            module = cls._accelerator()
            return bool(module is not None and module.is_available())
        except Exception as exc:
            log.debug("twinkle: %s detection failed: %s", cls.device_type, exc)
            return False

    @classmethod
    def device_count(cls) -> int:
        try:
            return int(cls._accelerator().device_count()) if cls.is_available() else 0
        except Exception:
            return 0

    def local_device(self, index: int = 0) -> Any:
        return _torch_device(self.device_type, index)

    def set_device(self, index: int) -> None:
        self._accelerator().set_device(int(index))

    def manual_seed(self, seed: int) -> None:
        if self.is_available():
            self._accelerator().manual_seed_all(seed)

    def get_rng_state(self) -> Any:
        return self._accelerator().get_rng_state_all() if self.is_available() else None

    def set_rng_state(self, state: Any) -> None:
        if state is not None and self.is_available():
            self._accelerator().set_rng_state_all(state)


class CudaPlatform(TorchAcceleratorPlatform):
    """NVIDIA GPUs through `torch.cuda`; nccl for collectives; Ray resource `GPU`."""

    device_type = "cuda"
    aliases = ("gpu", "nvidia")
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    dist_backend = "nccl"
    ray_noset_env_vars = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",)
    detection_priority = 100

    @classmethod
    def _accelerator(cls) -> Any | None:
        torch = torch_or_none()
        return None if torch is None else torch.cuda


class NpuPlatform(TorchAcceleratorPlatform):
    """Huawei Ascend NPUs through `torch_npu` (imported only when installed); hccl; Ray `NPU`."""

    device_type = "npu"
    aliases = ("ascend",)
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource = "NPU"
    dist_backend = "hccl"
    ray_noset_env_vars = ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",)
    detection_priority = 90

    @classmethod
    def _accelerator(cls) -> Any | None:
        module = torch_npu_or_none()
        return None if module is None else getattr(module, "npu", None)


class MpsPlatform(AcceleratorPlatform):
    """Apple silicon GPUs through `torch.mps`: one device, gloo for collectives, no Ray resource."""

    device_type = "mps"
    aliases = ("metal", "apple")
    visible_devices_env = None
    ray_resource = None
    dist_backend = "gloo"
    detection_priority = 50

    @classmethod
    def is_available(cls) -> bool:
        try:
            torch = torch_or_none()
            return bool(torch is not None and torch.backends.mps.is_available())
        except Exception as exc:
            log.debug("twinkle: mps detection failed: %s", exc)
            return False

    @classmethod
    def device_count(cls) -> int:
        return 1 if cls.is_available() else 0

    def local_device(self, index: int = 0) -> Any:
        return _torch_device("mps", None)

    def manual_seed(self, seed: int) -> None:
        if self.is_available():
            torch_or_none().mps.manual_seed(seed)

    def get_rng_state(self) -> Any:
        return torch_or_none().mps.get_rng_state() if self.is_available() else None

    def set_rng_state(self, state: Any) -> None:
        if state is not None and self.is_available():
            torch_or_none().mps.set_rng_state(state)


class TorchCpuPlatform(CpuPlatform):
    """CPU processes with torch: `torch.device('cpu')`, gloo; replaces core's plain cpu."""

    device_type = "cpu"
    aliases = ("host",)
    visible_devices_env = None
    ray_resource = "CPU"
    dist_backend = "gloo"
    detection_priority = 0

    @classmethod
    def device_count(cls) -> int:
        return os.cpu_count() or 1

    def local_device(self, index: int = 0) -> Any:
        return _torch_device("cpu", None)


#: The accelerator platforms with their own random generators, in detection order.
ACCELERATORS: tuple[type[AcceleratorPlatform], ...] = (CudaPlatform, NpuPlatform, MpsPlatform)

#: Registered name -> "module:attr" target (strings keep `twinkle plugins` free of torch).
PLATFORMS: dict[str, str] = {
    "cuda": "twinkle_local.platforms:CudaPlatform",
    "npu": "twinkle_local.platforms:NpuPlatform",
    "mps": "twinkle_local.platforms:MpsPlatform",
    "cpu": "twinkle_local.platforms:TorchCpuPlatform",
}
