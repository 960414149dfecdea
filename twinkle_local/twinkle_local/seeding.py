"""Seeding torch and the accelerators, and saving/restoring their random-generator state.

Core seeds python and numpy itself and calls these functions through the `twinkle_seed`,
`twinkle_get_rng_state` and `twinkle_set_rng_state` hooks. The state pair lets the in-process
backend give each simulated worker its own torch generator, as separate processes would have.
"""

from __future__ import annotations

import os
from typing import Any

from .platforms import ACCELERATORS, torch_or_none

#: Key of torch's CPU generator state in the dict core passes around.
TORCH_STATE_KEY = "torch"

#: Environment that makes cuBLAS, HCCL and flash-attention deterministic (set unless already set).
DETERMINISM_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "HCCL_DETERMINISTIC": "true",
    "FLASH_ATTENTION_DETERMINISTIC": "1",
}


def _state_key(platform: type) -> str:
    return f"torch_{platform.device_type}"


def seed_torch(seed: int, full_determinism: bool = False) -> None:
    """Seed torch's CPU generator and every available accelerator's.

    With `full_determinism`, also set `DETERMINISM_ENV` (without overriding values the user
    set), `torch.use_deterministic_algorithms(True)` and cudnn's deterministic mode: slower,
    but bit-for-bit repeatable runs. Without it nothing about determinism is changed.
    """
    torch = torch_or_none()
    if torch is None:
        return
    if full_determinism:
        for key, value in DETERMINISM_ENV.items():
            os.environ.setdefault(key, value)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(seed)
    for platform in ACCELERATORS:
        if platform.is_available():
            platform().manual_seed(seed)


def get_torch_rng_state() -> dict[str, Any] | None:
    """`{'torch': cpu state, 'torch_<device>': accelerator state...}`; None without torch."""
    torch = torch_or_none()
    if torch is None:
        return None
    state: dict[str, Any] = {TORCH_STATE_KEY: torch.get_rng_state()}
    for platform in ACCELERATORS:
        if platform.is_available():
            state[_state_key(platform)] = platform().get_rng_state()
    return state


def set_torch_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_torch_rng_state` returned; keys it did not write are ignored."""
    torch = torch_or_none()
    if torch is None or TORCH_STATE_KEY not in state:
        return
    torch.set_rng_state(state[TORCH_STATE_KEY])
    for platform in ACCELERATORS:
        key = _state_key(platform)
        if key in state and platform.is_available():
            platform().set_rng_state(state[key])
