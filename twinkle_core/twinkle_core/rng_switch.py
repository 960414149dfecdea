"""Switching one process's random generators between the workers (and the driver) it hosts.

A process that hosts several workers (the in-process backend, a torchrun process running the
driver script and its workers, a Ray actor holding colocated roles) gives each of them its own
python, numpy and plugin generators (e.g. torch's), as separate processes would have. Copying
every generator out and back around every call costs more than a small call's whole trip
(numpy's legacy `get_state`/`set_state` alone take 20-25 us each here), so the switch only
moves what differs:

- each *party* (the process's own generators, or one worker's) keeps an exact *fingerprint*
  of every generator (a raw read of its state's bytes) and the full state behind it;
- switching reads the live fingerprints: the outgoing party's full state is fetched only if
  it drew numbers since (its fingerprint changed), and the incoming party's is installed only
  where it differs from the live one, by writing its raw bytes back.

A call whose parties drew nothing costs a few raw reads per switch; one whose worker drew
costs one state fetch per generator it drew from. Raw reads and writes are checked against
the libraries' own state APIs when the switch is built; where a check fails (another Python
or numpy) the fingerprint is built from the full state and installing sets it: slower, never
wrong.

Generators come from core (python's `random`, numpy's legacy global generator) and from
plugins (the `twinkle_random_generators` hook, e.g. torch's CPU and accelerator generators). A
worker whose state holds keys of a plugin that saves its generator only through
`twinkle_get_rng_state` is not `supported()`: `WorkerState.activate` copies every state around
its calls instead.
"""

from __future__ import annotations

import array
import ctypes
import random
import struct
import sys
import threading
from typing import Any

import numpy as np

from .plugins import plugin_system

#: Bytes of CPython's and numpy's Mersenne Twister state: 624 32-bit words and an index.
_MT_WORDS = 624
_MT_BYTES = _MT_WORDS * 4 + 4


class RandomGenerator:
    """One random generator the switch moves between parties (plugins subclass it).

    A state is what `get()` returns. `fingerprint(state)` must equal `read()` while that state
    is installed, and be exact: equal fingerprints mean equal states (a fingerprint that leaves
    out part of the state, such as a cached value, makes the switch lose it). `read()` is what
    every switch pays, so make it cheap (raw bytes rather than a copy of the state object).
    The dict form is the generator's part of `twinkle_core.plugin.get_rng_state()`.
    """

    #: The key of this generator's state in `get_rng_state()` (override `owns` for several).
    key = ""

    def owns(self, key: str) -> bool:
        """Whether `key` of a `get_rng_state()` dict is (part of) this generator's state."""
        return key == self.key

    def pick(self, rng_state: dict[str, Any]) -> Any:
        """This generator's state out of a `get_rng_state()` dict."""
        return rng_state[self.key]

    def as_dict(self, state: Any) -> dict[str, Any]:
        """`state` as this generator's part of a `get_rng_state()` dict."""
        return {self.key: state}

    def read(self) -> Any:
        """The fingerprint of the live state."""
        raise NotImplementedError

    def get(self) -> Any:
        """The live state."""
        raise NotImplementedError

    def set(self, state: Any) -> None:
        """Install `state`."""
        raise NotImplementedError

    def fingerprint(self, state: Any) -> Any:
        """The fingerprint `read()` gives while `state` is installed."""
        raise NotImplementedError


class PythonRandom(RandomGenerator):
    """`random`'s module-level generator: the C struct's raw bytes plus `gauss_next`.

    Where the raw struct is found and checked, a state is `(raw bytes, gauss_next)`, its own
    fingerprint, read and written directly; `getstate()`'s form appears only in
    `get_rng_state()` dicts. Elsewhere a state is `getstate()`'s tuple.
    """

    key = "python"

    def __init__(self) -> None:
        self.inst: Any = random._inst  # type: ignore[attr-defined]  # what random.random() uses
        self.address = self._raw_address()

    def _raw_address(self) -> int | None:
        """The address of the C struct {int index; uint32 state[624]} after the object header,
        when this interpreter lays it out so (a read and a write checked against getstate and
        setstate); else None: the slow, exact copies are used."""
        try:
            offset = object.__basicsize__
            base = type(self.inst).__mro__[-2]  # _random.Random, the C type
            if base.__basicsize__ < offset + _MT_BYTES or sys.implementation.name != "cpython":
                return None
            address = id(self.inst) + offset
            saved = self.inst.getstate()
            if ctypes.string_at(address, _MT_BYTES) != self._packed(saved):
                return None
            other = random.Random(20261205).getstate()
            try:
                ctypes.memmove(address, self._packed(other), _MT_BYTES)
                written = self.inst.getstate()
            finally:
                self.inst.setstate(saved)
            if written[1] != other[1] or self._unpacked(self._packed(other)) != other[1]:
                return None
            return address
        except Exception:  # pragma: no cover - any surprise: use the slow, exact copies
            return None

    @staticmethod
    def _packed(state: Any) -> bytes:
        words = state[1]
        return struct.pack("=i", words[-1]) + array.array("I", words[:-1]).tobytes()

    @staticmethod
    def _unpacked(raw: bytes) -> tuple[int, ...]:
        return (*array.array("I", raw[4:]), struct.unpack_from("=i", raw)[0])

    def pick(self, rng_state: dict[str, Any]) -> Any:
        state = rng_state[self.key]
        return state if self.address is None else (self._packed(state), state[2])

    def as_dict(self, state: Any) -> dict[str, Any]:
        if self.address is not None:
            state = (self.inst.VERSION, self._unpacked(state[0]), state[1])
        return {self.key: state}

    def read(self) -> Any:
        if self.address is None:
            return self.inst.getstate()
        return (ctypes.string_at(self.address, _MT_BYTES), self.inst.gauss_next)

    def get(self) -> Any:
        return self.read()

    def set(self, state: Any) -> None:
        if self.address is None:
            self.inst.setstate(state)
            return
        ctypes.memmove(self.address, state[0], _MT_BYTES)
        self.inst.gauss_next = state[1]

    def fingerprint(self, state: Any) -> Any:
        return state


class NumpyRandom(RandomGenerator):
    """numpy's legacy global generator (`np.random.rand` & co).

    Its whole state is the bit generator's MT19937 words and position plus the cached second
    normal deviate (`has_gauss`, `gauss`), which lives in the `RandomState` object. Where both
    places are found and checked (reads and writes against `get_state`/`set_state`), a state
    is their raw bytes, its own fingerprint, read and written directly; `get_state()`'s form
    appears only in `get_rng_state()` dicts. Elsewhere a state is `get_state()`'s tuple,
    fingerprinted by its packed bytes: slower, never wrong.
    """

    key = "numpy"

    def __init__(self) -> None:
        self.bit_generator: Any = None
        self.address: int | None = None  # {uint32 key[624]; int pos}
        self.aug_address: int | None = None  # {int has_gauss; (pad); double gauss}
        self.pad = b"\0\0\0\0"
        try:
            self._find_raw()
        except Exception:  # pragma: no cover - another numpy: the slow, exact copies
            self.address = self.aug_address = None

    def _find_raw(self) -> None:
        legacy = np.random.mtrand._rand
        bit_generator = legacy._bit_generator
        saved: Any = np.random.get_state()
        if saved[0] != "MT19937":
            return
        try:
            address = int(bit_generator.ctypes.state_address)
            aug = self._find_aug(legacy)
            if aug is None:
                return
            self.address, self.aug_address = address, aug
            self.pad = ctypes.string_at(aug + 4, 4)
            other = np.random.RandomState(20261205)
            other.normal()  # a cached deviate: has_gauss 1
            wanted = other.get_state()
            self._write(self._packed(wanted))
            written = np.random.get_state()
            back = self.as_dict(self._packed(wanted))[self.key]
            if not (
                _same_numpy_state(written, wanted)
                and _same_numpy_state(back, wanted)
                and self.read() == self._packed(wanted)
            ):
                self.address = self.aug_address = None
                return
            self.bit_generator = bit_generator
        finally:
            np.random.set_state(saved)
        if self.address is not None and self.read() != self._packed(saved):
            self.address = self.aug_address = None  # pragma: no cover

    @staticmethod
    def _find_aug(legacy: Any) -> int | None:
        """The address of `has_gauss` in the `RandomState` object: found as the one place
        holding a distinctive cached deviate, then checked with another."""
        size = type(legacy).__basicsize__
        state: list[Any] = list(np.random.get_state())
        marks = []
        for has_gauss, gauss in ((1, 1.2345678901234567), (0, -7.654321098765432)):
            state[3], state[4] = has_gauss, gauss
            np.random.set_state(tuple(state))
            memory = ctypes.string_at(id(legacy), size)
            pattern = struct.pack("=d", gauss)
            found = [i for i in range(size - 7) if memory[i : i + 8] == pattern]
            if len(found) != 1 or found[0] < 8:
                return None
            offset = found[0] - 8
            if struct.unpack_from("=i", memory, offset)[0] != has_gauss:
                return None
            marks.append(offset)
        if marks[0] != marks[1]:
            return None
        return id(legacy) + marks[0]

    def _packed(self, state: Any) -> bytes:
        words = np.ascontiguousarray(state[1], dtype=np.uint32).tobytes()
        aug = struct.pack("=i", int(state[3])) + self.pad + struct.pack("=d", float(state[4]))
        return words + struct.pack("=i", int(state[2])) + aug

    def _write(self, packed: bytes) -> None:
        assert self.address is not None and self.aug_address is not None
        ctypes.memmove(self.address, packed, _MT_BYTES)
        ctypes.memmove(self.aug_address, packed[_MT_BYTES:], 16)

    def pick(self, rng_state: dict[str, Any]) -> Any:
        state = rng_state[self.key]
        return state if self.address is None else self._packed(state)

    def as_dict(self, state: Any) -> dict[str, Any]:
        if self.address is not None:
            key = np.frombuffer(state, dtype=np.uint32, count=_MT_WORDS).copy()
            pos, has_gauss = struct.unpack_from("=ii", state, _MT_BYTES - 4)
            gauss = struct.unpack_from("=d", state, _MT_BYTES + 8)[0]
            state = ("MT19937", key, pos, has_gauss, gauss)
        return {self.key: state}

    def read(self) -> Any:
        if self.address is None or self.aug_address is None:
            return self._packed(np.random.get_state())
        return ctypes.string_at(self.address, _MT_BYTES) + ctypes.string_at(self.aug_address, 16)

    def get(self) -> Any:
        return np.random.get_state() if self.address is None else self.read()

    def set(self, state: Any) -> None:
        if self.address is None:
            np.random.set_state(state)
            return
        with self.bit_generator.lock:  # (numpy's draws hold it, some without the GIL)
            self._write(state)

    def fingerprint(self, state: Any) -> Any:
        return self._packed(state) if self.address is None else state


def _same_numpy_state(a: Any, b: Any) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


class RngParty:
    """The process's own generators, or one worker's: per generator, fingerprint and state."""

    __slots__ = ("fingerprints", "name", "states")

    def __init__(self, name: str, states: list[Any], fingerprints: list[Any]) -> None:
        self.name = name
        self.states = states
        self.fingerprints = fingerprints

    def __repr__(self) -> str:
        return f"<rng party {self.name}>"


class RngSwitch:
    """Puts one party's generators in place at a time; the process's own between calls,
    unless a worker keeps its own in place (`WorkerState.activate(keep=True)`, a Ray actor).

    Not thread-safe on its own, as the generators it moves are not: a backend runs one call
    at a time per process (or per worker sharing it), and nested calls (a worker calling
    another worker of the same process) enter and leave in stack order on one thread.
    """

    def __init__(self, generators: list[RandomGenerator]) -> None:
        self.generators = generators
        #: The plugin system whose generators these are (`rng_switch` rebuilds on a new one).
        self.plugins: Any = None
        #: The process's own generators (the driver's, or a Ray actor's first object's).
        self.host = self.capture("process")
        self.installed = self.host

    # ----------------------------------------------------------------- parties
    def capture(self, name: str) -> RngParty:
        """A party holding the generators' current states."""
        states = [g.get() for g in self.generators]
        return RngParty(name, states, self._fingerprints(states))

    def party(self, name: str, rng_state: dict[str, Any] | None) -> RngParty:
        """A party from a state of `get_rng_state()` (e.g. after a worker's construction);
        None: the live states."""
        if rng_state is None:
            return self.capture(name)
        states = [g.pick(rng_state) for g in self.generators]
        return RngParty(name, states, self._fingerprints(states))

    def state_dict(self, party: RngParty) -> dict[str, Any]:
        """`party`'s generators as a `get_rng_state()` dict (live ones while it is installed)."""
        out: dict[str, Any] = {}
        live = party is self.installed
        for g, state in zip(self.generators, party.states, strict=True):
            out.update(g.as_dict(g.get() if live else state))
        return out

    def _fingerprints(self, states: list[Any]) -> list[Any]:
        return [g.fingerprint(s) for g, s in zip(self.generators, states, strict=True)]

    def supported(self, rng_state: dict[str, Any] | None) -> bool:
        """Whether every generator in a `get_rng_state()` dict is one this switch moves."""
        if rng_state is None:
            return True
        return all(any(g.owns(k) for g in self.generators) for k in rng_state)

    # ----------------------------------------------------------------- switching
    def enter(self, party: RngParty) -> RngParty:
        """Put `party`'s generators in place; returns the party to give back to `leave`."""
        previous = self.installed
        if party is not previous:
            self._switch(previous, party)
            self.installed = party
        return previous

    def leave(self, party: RngParty, previous: RngParty) -> None:
        """`party`'s call ended: keep its new states, put `previous`'s back."""
        if party is not previous:
            self._switch(party, previous)
            self.installed = previous

    def _switch(self, outgoing: RngParty, incoming: RngParty) -> None:
        for i, g in enumerate(self.generators):
            live = g.read()
            if live != outgoing.fingerprints[i]:  # the outgoing party drew numbers
                outgoing.states[i] = g.get()
                outgoing.fingerprints[i] = live
            if live != incoming.fingerprints[i]:
                g.set(incoming.states[i])


_switch: RngSwitch | None = None
_switch_lock = threading.Lock()


def rng_switch() -> RngSwitch:
    """This process's switch: built once, with core's generators and the plugins'."""
    global _switch
    system = plugin_system()
    switch = _switch
    if switch is None or switch.plugins is not system:  # (plugins reloaded: tests)
        generators: list[RandomGenerator] = [PythonRandom(), NumpyRandom()]
        for found in system.hook.twinkle_random_generators():
            generators.extend(found or ())
        built = RngSwitch(generators)  # (plugin code runs with no lock held)
        built.plugins = system
        with _switch_lock:  # two threads building at once: both use the first one kept
            if _switch is None or _switch.plugins is not system:
                _switch = built
            switch = _switch
    return switch
