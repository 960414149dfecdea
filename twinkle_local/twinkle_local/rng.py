"""torch's random generators for core's generator switch (`twinkle_core.plugin.RngSwitch`).

A process hosting several workers (the driver and its workers under torchrun, colocated roles
in a Ray actor, in-process workers) gives each its own generators, switched around its calls by
core's switch, which saves and sets only what changed between fingerprints. This module gives
it torch's CPU generator and every available accelerator's (`twinkle_random_generators`): a
fingerprint is the raw bytes of the generators' state tensors.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from twinkle_core.plugin import RandomGenerator

from .seeding import TORCH_STATE_KEY, get_torch_rng_state, set_torch_rng_state


class TorchGenerator(RandomGenerator):
    """torch's CPU generator and every available accelerator's (twinkle-local's seeding).

    Without an accelerator (the state holds only the CPU generator) the CPU generator is read
    directly, without asking every platform whether it is available at each switch. Built
    before torch is imported (a Ray actor's switch), it reads through `get_torch_rng_state`
    (the pending seed) until torch arrives, then decides once.
    """

    key = TORCH_STATE_KEY

    def __init__(self) -> None:
        #: torch's CPU generator, when it is the only one (the fast path); else None.
        self.generator: Any = None
        self.decided = False
        self._decide()

    def _decide(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        self.decided = True
        state = get_torch_rng_state()
        if state is not None and list(state) == [TORCH_STATE_KEY]:
            self.generator = torch.default_generator

    def owns(self, key: str) -> bool:
        return key.startswith(TORCH_STATE_KEY)  # torch, torch_<device>, torch_pending

    def pick(self, rng_state: dict[str, Any]) -> Any:
        return {k: v for k, v in rng_state.items() if k.startswith(TORCH_STATE_KEY)}

    def as_dict(self, state: Any) -> dict[str, Any]:
        return dict(state) if state else {}

    def read(self) -> Any:
        if self.generator is not None:
            return _tensor_bytes(self.generator.get_state())
        if not self.decided:
            self._decide()
            if not self.decided:  # torch not imported: at most a pending seed, no tensors
                state = get_torch_rng_state()
                return tuple(state.items()) if state else None
            if self.generator is not None:
                return _tensor_bytes(self.generator.get_state())
        return self.fingerprint(get_torch_rng_state())

    def get(self) -> Any:
        if self.generator is not None:
            return {TORCH_STATE_KEY: self.generator.get_state()}
        return get_torch_rng_state()

    def set(self, state: Any) -> None:
        if not state:
            return  # the worker has no torch state of its own yet: it draws from the live one
        if self.generator is not None and list(state) == [TORCH_STATE_KEY]:
            self.generator.set_state(state[TORCH_STATE_KEY])
        else:
            set_torch_rng_state(state)

    def fingerprint(self, state: Any) -> Any:
        if not state:
            return None
        if self.generator is not None and list(state) == [TORCH_STATE_KEY]:
            return _tensor_bytes(state[TORCH_STATE_KEY])
        return tuple((k, _tensor_bytes(v)) for k, v in state.items())


def _tensor_bytes(value: Any) -> Any:
    """A tensor's raw bytes (of lists and tuples, each item's); other values as they are."""
    if isinstance(value, (list, tuple)):
        return tuple(_tensor_bytes(v) for v in value)
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is None:  # not a tensor (a pending seed's numbers)
        return value
    return ctypes.string_at(data_ptr(), value.numel() * value.element_size())
