"""Switching the process's random generators between the driver and the workers it hosts.

Under torchrun a process runs the driver script and one worker of each remote object it holds.
Each of them (a *party*) has its own python, numpy and torch generators, as separate processes
would: before a worker's method runs its generators are put in place, afterwards the driver's
come back. Saving and restoring every generator around every call costs more than the call's
whole exchange (numpy's `get_state`/`set_state` alone take tens of microseconds), so this
module only moves what differs:

- each party keeps a *fingerprint* of every generator (a cheap raw read of its state) and the
  full state behind it;
- entering a party reads the fingerprints: a generator whose state equals the party's own is
  left alone; only a party that drew numbers since (its fingerprint changed) has its full
  state fetched, and only a generator whose state differs is set.

A worker and the driver that draw nothing (or draw from generators the other does not use)
cost a few raw reads per call. The raw reads are checked against the libraries' own state
APIs when the switch is built; where a check fails (another Python or numpy) the fingerprint
is the full state itself: slower, never wrong. Generators added by other plugins (keys of
`twinkle_core.plugin.get_rng_state()` this module does not know) make `supported()` False,
and callers fall back to core's `WorkerState.activate`.
"""

from __future__ import annotations

import array
import ctypes
import random
import struct
import sys
from typing import Any

import numpy as np

from .seeding import TORCH_STATE_KEY, get_torch_rng_state, set_torch_rng_state

#: Bytes of CPython's and numpy's Mersenne Twister state: 624 32-bit words and an index.
_MT_WORDS = 624
_MT_BYTES = _MT_WORDS * 4 + 4


class _Generator:
    """One random generator: fingerprints, full state, and the rule for comparing them."""

    key = ""
    #: Whether the fingerprint covers the whole state (`extra` None, always `trusted`).
    simple = True

    def read(self) -> Any:
        """The fingerprint of the live state (equal fingerprints: equal states, see `trusted`)."""
        raise NotImplementedError

    def get(self) -> Any:
        raise NotImplementedError

    def set(self, state: Any) -> None:
        raise NotImplementedError

    def fingerprint(self, state: Any) -> Any:
        """The fingerprint `read()` gives while `state` is installed."""
        raise NotImplementedError

    def extra(self, state: Any) -> Any:
        """Part of the state the fingerprint does not cover (compared from the full states)."""
        return None

    def trusted(self, state: Any) -> bool:
        """Whether an unchanged fingerprint proves the live state still equals `state`."""
        return True


class _PythonRandom(_Generator):
    """`random`'s module-level generator: raw CPython state plus `gauss_next`."""

    key = "python"

    def __init__(self) -> None:
        self.inst = random._inst  # type: ignore[attr-defined]  # what random.random() uses
        self.raw = self._raw_reader()

    def _raw_reader(self) -> Any:
        """A reader of the C struct {int index; uint32 state[624]} after the object header,
        when this interpreter lays it out so (checked against getstate); else None."""
        try:
            offset = object.__basicsize__
            base = type(self.inst).__mro__[-2]  # _random.Random, the C type
            if base.__basicsize__ < offset + _MT_BYTES or sys.implementation.name != "cpython":
                return None
            address = id(self.inst) + offset

            def read() -> bytes:
                return ctypes.string_at(address, _MT_BYTES)

            if read() != self._packed(self.inst.getstate()):
                return None
            return read
        except Exception:  # pragma: no cover - any surprise: use the slow, exact reads
            return None

    @staticmethod
    def _packed(state: Any) -> bytes:
        words = state[1]
        return struct.pack("=i", words[-1]) + array.array("I", words[:-1]).tobytes()

    def read(self) -> Any:
        if self.raw is None:
            return self.inst.getstate()
        return (self.raw(), self.inst.gauss_next)

    def get(self) -> Any:
        return self.inst.getstate()

    def set(self, state: Any) -> None:
        self.inst.setstate(state)

    def fingerprint(self, state: Any) -> Any:
        if self.raw is None:
            return state
        return (self._packed(state), state[2])


class _NumpyRandom(_Generator):
    """numpy's legacy global generator (`np.random.rand` & co): raw MT19937 state.

    The cached second normal deviate (`has_gauss`) lives outside the bit generator: a party
    whose state holds one is never trusted on an unchanged fingerprint (drawing the cached
    value changes no raw byte).
    """

    key = "numpy"

    def __init__(self) -> None:
        self.raw = self._raw_reader()
        self.simple = self.raw is None  # the slow fingerprint holds has_gauss and gauss

    @staticmethod
    def _raw_reader() -> Any:
        try:
            bit_generator = np.random.mtrand._rand._bit_generator
            address = bit_generator.ctypes.state_address

            def read() -> bytes:
                return ctypes.string_at(address, _MT_BYTES)

            state = np.random.get_state()
            if state[0] != "MT19937" or read() != _NumpyRandom._packed(state):
                return None
            return read
        except Exception:  # pragma: no cover - another numpy: use the slow, exact reads
            return None

    @staticmethod
    def _packed(state: Any) -> bytes:
        return np.ascontiguousarray(state[1], dtype=np.uint32).tobytes() + struct.pack(
            "=i", int(state[2])
        )

    def read(self) -> Any:
        if self.raw is None:
            return self._slow(np.random.get_state())
        return self.raw()

    def _slow(self, state: Any) -> Any:
        return (self._packed(state), int(state[3]), float(state[4]))

    def get(self) -> Any:
        return np.random.get_state()

    def set(self, state: Any) -> None:
        np.random.set_state(state)

    def fingerprint(self, state: Any) -> Any:
        return self._packed(state) if self.raw is not None else self._slow(state)

    def extra(self, state: Any) -> Any:
        return (int(state[3]), float(state[4]))

    def trusted(self, state: Any) -> bool:
        return self.raw is None or int(state[3]) == 0


class _Torch(_Generator):
    """torch's CPU generator and every available accelerator's (twinkle-local's seeding).

    Without an accelerator (the state holds only the CPU generator) the CPU generator is read
    directly, without asking every platform whether it is available at each call.
    """

    key = TORCH_STATE_KEY

    def __init__(self) -> None:
        state = get_torch_rng_state()
        self.cpu_only = state is not None and list(state) == [TORCH_STATE_KEY]
        if self.cpu_only:
            import torch

            self.generator = torch.default_generator

    def read(self) -> Any:
        if self.cpu_only:
            return _tensor_bytes(self.generator.get_state())
        return self.fingerprint(get_torch_rng_state())

    def get(self) -> Any:
        if self.cpu_only:
            return {TORCH_STATE_KEY: self.generator.get_state()}
        return get_torch_rng_state()

    def set(self, state: Any) -> None:
        if not state:
            return
        if self.cpu_only:
            self.generator.set_state(state[TORCH_STATE_KEY])
        else:
            set_torch_rng_state(state)

    def fingerprint(self, state: Any) -> Any:
        if state is None:
            return None
        if self.cpu_only and list(state) == [TORCH_STATE_KEY]:
            return _tensor_bytes(state[TORCH_STATE_KEY])
        return tuple((k, _tensor_bytes(v)) for k, v in state.items())


def _tensor_bytes(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_tensor_bytes(v) for v in value)
    try:
        return ctypes.string_at(value.data_ptr(), value.numel() * value.element_size())
    except AttributeError:  # not a tensor
        return value


class Party:
    """The driver or one worker: per generator, its fingerprint and full state."""

    __slots__ = ("fingerprints", "name", "states")

    def __init__(self, name: str, states: list[Any], fingerprints: list[Any]) -> None:
        self.name = name
        self.states = states
        self.fingerprints = fingerprints

    def __repr__(self) -> str:
        return f"<rng party {self.name}>"


class RngSwitch:
    """Puts one party's generators in place at a time; the driver's between calls.

    Not thread-safe on its own: the local backend runs one call at a time per process (its
    lock), and nested calls (a worker calling another worker of the same process) enter and
    leave in stack order on the same thread.
    """

    def __init__(self) -> None:
        self.generators: list[_Generator] = [_PythonRandom(), _NumpyRandom(), _Torch()]
        self.driver = self.capture("driver")
        self.installed = self.driver

    # ----------------------------------------------------------------- parties
    def capture(self, name: str) -> Party:
        """A party holding the generators' current states."""
        states = [g.get() for g in self.generators]
        return Party(name, states, self._fingerprints(states))

    def party(self, name: str, rng_state: dict[str, Any] | None) -> Party:
        """A party from a state of core's `get_rng_state()` (e.g. after a worker's construction)."""
        if rng_state is None:
            return self.capture(name)
        states = []
        for g in self.generators:
            if g.key == TORCH_STATE_KEY:
                states.append({k: v for k, v in rng_state.items() if k.startswith("torch")})
            else:
                states.append(rng_state[g.key])
        return Party(name, states, self._fingerprints(states))

    def _fingerprints(self, states: list[Any]) -> list[Any]:
        return [g.fingerprint(s) for g, s in zip(self.generators, states, strict=True)]

    @staticmethod
    def supported(rng_state: dict[str, Any] | None) -> bool:
        """Whether every generator in core's state is one this switch handles."""
        if rng_state is None:
            return True
        return all(k in ("python", "numpy") or k.startswith("torch") for k in rng_state)

    # ----------------------------------------------------------------- switching
    def enter(self, party: Party) -> Party:
        """Put `party`'s generators in place; returns the party to give back to `leave`."""
        previous = self.installed
        if party is not previous:
            self._switch(previous, party)
            self.installed = party
        return previous

    def leave(self, party: Party, previous: Party) -> None:
        """`party`'s call ended: keep its new states, put `previous`'s back."""
        if party is not previous:
            self._switch(party, previous)
            self.installed = previous

    def _switch(self, outgoing: Party, incoming: Party) -> None:
        for i, g in enumerate(self.generators):
            live = g.read()
            if g.simple:
                if live != outgoing.fingerprints[i]:  # the outgoing party drew numbers
                    outgoing.states[i] = g.get()
                    outgoing.fingerprints[i] = live
                if live != incoming.fingerprints[i]:
                    g.set(incoming.states[i])
                continue
            state = outgoing.states[i]
            if live != outgoing.fingerprints[i] or not g.trusted(state):
                # The outgoing party drew numbers since its state was recorded.
                state = g.get()
                outgoing.states[i] = state
                outgoing.fingerprints[i] = live
            target = incoming.states[i]
            if (
                live != incoming.fingerprints[i]
                or g.extra(target) != g.extra(state)
                or not g.trusted(target)
            ):
                g.set(target)
