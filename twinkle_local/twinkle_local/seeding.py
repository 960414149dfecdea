"""Seeding torch and the accelerators, and saving/restoring their random-generator state.

Core seeds python and numpy itself and calls these functions through the `twinkle_seed`,
`twinkle_get_rng_state` and `twinkle_set_rng_state` hooks. The state pair lets the in-process
backend give each simulated worker its own torch generator, as separate processes would have.

Seeding never imports torch. A driver that only places Ray actors should not pay torch's import
(about a second) for generators it never draws from: while torch is not imported, the seed is
remembered, and applied by a one-shot import hook (`deferred.when_imported`) the moment the
user's code imports torch. Nothing can draw from torch before it is imported, so this gives the
same numbers as seeding at once. A state saved meanwhile is `{'torch_pending': (seed, full)}`;
restoring it after torch arrived seeds torch afresh, which is exactly the state it stood for.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import deferred
from .platforms import ACCELERATORS, torch_installed

#: Key of torch's CPU generator state in the dict core passes around.
TORCH_STATE_KEY = "torch"
#: Key of a seed not yet applied because torch is not imported yet.
PENDING_KEY = "torch_pending"

#: Environment that makes cuBLAS, HCCL and flash-attention deterministic (set unless already set).
DETERMINISM_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "HCCL_DETERMINISTIC": "true",
    "FLASH_ATTENTION_DETERMINISTIC": "1",
}

#: The last seed given while torch was not imported: (seed, full_determinism), or None.
_pending: tuple[int, bool] | None = None


def _state_key(platform: type) -> str:
    return f"torch_{platform.device_type}"


def seed_torch(seed: int, full_determinism: bool = False) -> None:
    """Seed torch's CPU generator and every available accelerator's (now, or when torch is
    first imported).

    With `full_determinism`, also set `DETERMINISM_ENV` (without overriding values the user
    set), `torch.use_deterministic_algorithms(True)` and cudnn's deterministic mode: slower,
    but bit-for-bit repeatable runs. Without it nothing about determinism is changed.
    """
    global _pending
    torch = sys.modules.get("torch")
    if torch is None:
        if not torch_installed():
            return  # not installed
        _pending = (seed, full_determinism)
        deferred.cancel("torch")
        deferred.when_imported("torch", _apply_pending)
        return
    _pending = None
    _seed_now(torch, seed, full_determinism)


def _apply_pending(torch: Any) -> None:
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        _seed_now(torch, *pending)


def _seed_now(torch: Any, seed: int, full_determinism: bool) -> None:
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
    """`{'torch': cpu state, 'torch_<device>': accelerator state...}`; the pending seed while
    torch is not imported; None without torch or a seed."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None if _pending is None else {PENDING_KEY: _pending}
    state: dict[str, Any] = {TORCH_STATE_KEY: torch.get_rng_state()}
    for platform in ACCELERATORS:
        if platform.is_available():
            state[_state_key(platform)] = platform().get_rng_state()
    return state


def set_torch_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_torch_rng_state` returned; keys it did not write are ignored."""
    global _pending
    if PENDING_KEY in state:
        seed, full = state[PENDING_KEY]
        if "torch" in sys.modules:
            _seed_now(sys.modules["torch"], seed, full)
        else:
            seed_torch(seed, full)
        return
    torch = sys.modules.get("torch")
    if torch is None or TORCH_STATE_KEY not in state:
        return
    torch.set_rng_state(state[TORCH_STATE_KEY])
    for platform in ACCELERATORS:
        key = _state_key(platform)
        if key in state and platform.is_available():
            platform().set_rng_state(state[key])
