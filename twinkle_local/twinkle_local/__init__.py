"""twinkle-local: the torchrun backend (`initialize(mode='local')`) and torch platforms.

Importing this package does not import torch; the platforms and helpers import it on first use.
"""

from __future__ import annotations

from importlib.metadata import version as _dist_version

__version__ = _dist_version("twinkle-local")  # written once: in pyproject.toml

from .backend import LocalBackend
from .distributed import to_torch_device_mesh
from .platforms import CudaPlatform, MpsPlatform, NpuPlatform, TorchCpuPlatform

__all__ = [
    "CudaPlatform",
    "LocalBackend",
    "MpsPlatform",
    "NpuPlatform",
    "TorchCpuPlatform",
    "__version__",
    "to_torch_device_mesh",
]
