"""Seeding and random-generator state for python, numpy and (through hooks) plugin libraries."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np

from .plugins import plugin_system


def seed_everything(seed: int, full_determinism: bool = False) -> None:
    """Seed python and numpy here, and every library a plugin seeds via `twinkle_seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ["PYTHONHASHSEED"] = str(seed)
    plugin_system().hook.twinkle_seed(seed=seed, full_determinism=full_determinism)


def get_rng_state() -> dict[str, Any]:
    """The state of every random generator twinkle knows of (python, numpy, plugins')."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    for part in plugin_system().hook.twinkle_get_rng_state():
        if part:
            state.update(part)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state from `get_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    plugin_system().hook.twinkle_set_rng_state(state=state)
