"""The generator switch's property check, shared by core's test (python and numpy) and
twinkle-local's (torch too): any sequence of draws by the process, two workers and a nested
call must give, through `WorkerState.activate`, exactly what saving and restoring every
generator around each activation gives."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from twinkle_core import DeviceMesh, WorkerContext
from twinkle_core.plugin import WorkerState, get_rng_state, seed_everything, set_rng_state

#: What a step may draw (a test adds its own library's draws).
DRAWS: dict[str, Callable[[], object]] = {
    "py_random": lambda: random.random(),
    "py_gauss": lambda: random.gauss(0, 1),  # keeps a cached second deviate
    "np_rand": lambda: float(np.random.rand()),
    "np_normal": lambda: float(np.random.normal()),  # legacy gauss: cached second deviate
    "nothing": lambda: None,
}
#: Who draws: the process itself, worker 0, worker 1, or worker 1 called from inside worker 0.
WHO = ["process", "w0", "w1", "w0>w1"]


def context(rank: int) -> WorkerContext:
    return WorkerContext(rank, 2, rank, 2, "g", DeviceMesh.from_sizes(dp_size=2))


def worker_states(constructor_draws: Callable[[], object]) -> dict[str, dict]:
    """Two workers' states from one seed; worker 0's constructor ran `constructor_draws`."""
    seed_everything(11)
    base = get_rng_state()
    constructor_draws()
    w0 = get_rng_state()
    set_rng_state(base)
    return {"w0": w0, "w1": base}


class Reference:
    """What switching must equal: every state saved and restored around each activation."""

    def __init__(self, states: dict[str, dict]) -> None:
        self.states = {k: dict(v) for k, v in states.items()}

    def run(self, names: list[str], draw) -> object:
        outer = []
        for name in names:
            outer.append(get_rng_state())
            set_rng_state(self.states[name])
        try:
            return draw()
        finally:
            for name in reversed(names):
                self.states[name] = get_rng_state()
                set_rng_state(outer.pop())


class Workers:
    """The same through `WorkerState.activate`, the path every backend's workers take.

    `keep=True` is a Ray actor's way (a process running nothing but its workers' calls): a
    worker's generators stay in place after its call, and the process's own draws (slot 0's
    calls) first put the process's back (`restore_process_generators`)."""

    def __init__(self, states: dict[str, dict], keep: bool = False) -> None:
        self.workers = {k: WorkerState(context(i), v) for i, (k, v) in enumerate(states.items())}
        self.keep = keep

    def run(self, names: list[str], draw) -> object:
        if not names and self.keep:  # the process's own call
            WorkerState.restore_process_generators()
        return self._nested(names, draw)

    def _nested(self, names: list[str], draw) -> object:
        if not names:
            return draw()
        with self.workers[names[0]].activate(keep=self.keep):
            return self._nested(names[1:], draw)


def play(impl, steps, draws: dict[str, Callable[[], object]]) -> list:
    out = []
    for who, draw in steps:
        names = [] if who == "process" else who.split(">")
        out.append(impl.run(names, draws[draw]))
    return out


def _equal(a: object, b: object) -> bool:
    """Equal states: plain values compared as such, arrays and tensors by their elements."""
    same = a == b
    if isinstance(same, bool):
        return same
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def same_states(a: dict, b: dict) -> None:
    """Assert two `get_rng_state()` dicts hold the same states (plugins' keys included)."""
    assert a.keys() == b.keys()
    for key in a:
        if key == "numpy":
            assert np.array_equal(a[key][1], b[key][1]) and tuple(a[key][2:]) == tuple(b[key][2:])
        else:
            assert _equal(a[key], b[key]), key


def check_switching(steps, draws, constructor_draws, keep: bool = False) -> None:
    """The property: the same numbers, and the process's and workers' states end alike
    (`keep`: workers leave their generators in place, `Workers`)."""
    reference = Reference(worker_states(constructor_draws))
    expected = play(reference, steps, draws)
    process_after = get_rng_state()
    workers = Workers(worker_states(constructor_draws), keep)
    try:
        assert play(workers, steps, draws) == expected
    finally:
        if keep:  # the process's own generators back for what runs next
            WorkerState.restore_process_generators()
    same_states(get_rng_state(), process_after)
    for name, worker in workers.workers.items():
        state = worker.rng_state
        assert state is not None
        same_states(state, reference.states[name])
