"""The process's generator switch (`twinkle_core.rng_switch`): workers sharing a process draw
exactly what full save-and-restore around every call gives (the numbers of a process of their
own), while a call whose parties drew nothing copies no state; a plugin's generator joins
through `twinkle_random_generators`."""

from __future__ import annotations

import random

import numpy as np
import pytest
from _support.rng import DRAWS, WHO, check_switching, context
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_core import (
    DeviceGroup,
    get_worker_context,
    hookimpl,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugin import (
    RandomGenerator,
    WorkerState,
    get_rng_state,
    seed_everything,
    set_rng_state,
)
from twinkle_core.plugins import plugin_system, reset_plugins
from twinkle_core.rng_switch import rng_switch


def _constructor_draws() -> None:
    random.gauss(0, 1), np.random.normal()  # cached deviates left in both


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(WHO), st.sampled_from(sorted(DRAWS))), max_size=40))
def test_workers_draw_exactly_what_full_save_and_restore_draws(steps):
    check_switching(steps, DRAWS, _constructor_draws)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["process", "w0", "w1"]), st.sampled_from(sorted(DRAWS))),
        max_size=40,
    )
)
def test_workers_keeping_their_generators_in_place_draw_the_same(steps):
    """A Ray actor's way (`activate(keep=True)`, the process's own calls putting its
    generators back first): the numbers of saving and restoring every state around each call,
    whatever the order of calls and draws."""
    check_switching(steps, DRAWS, _constructor_draws, keep=True)


def test_a_worker_called_again_keeps_its_generators_without_switching(monkeypatch):
    """With `keep=True` the worker's next call finds its generators in place: no raw read or
    write at all, where switching in and out reads every generator twice a call."""
    seed_everything(4)
    worker = WorkerState(context(0), get_rng_state())
    switch = rng_switch()
    try:
        with worker.activate(keep=True):
            random.random()
        moves: list[str] = []
        original = switch._switch
        monkeypatch.setattr(
            switch, "_switch", lambda a, b: moves.append("switch") or original(a, b)
        )
        for _ in range(5):
            with worker.activate(keep=True):
                random.random()
        assert moves == []
        WorkerState.restore_process_generators()  # the process's own call: one switch
        assert moves == ["switch"] and switch.installed is switch.host
        WorkerState.restore_process_generators()  # already in place: nothing
        assert moves == ["switch"]
    finally:
        WorkerState.restore_process_generators()


def test_a_call_whose_parties_drew_nothing_copies_no_state(monkeypatch):
    """The per-call cost: raw reads and writes, no python/numpy state copies or sets, whether
    the worker drew or not (CPython and numpy 2 here: their raw paths are found)."""
    switch = rng_switch()
    assert switch.generators[0].address is not None  # CPython here: the raw paths exist
    assert switch.generators[1].address is not None
    seed_everything(3)
    base = get_rng_state()
    random.random(), np.random.rand()  # a constructor that drew (no cached gauss deviate)
    worker = WorkerState(context(0), get_rng_state())
    set_rng_state(base)
    with worker.activate():
        pass  # the first call installs the worker's own states once
    copies: list[str] = []
    for name in ("get_state", "set_state"):
        original = getattr(np.random, name)
        monkeypatch.setattr(
            np.random, name, lambda *a, _o=original, _n=name: copies.append(_n) or _o(*a)
        )
    for name in ("getstate", "setstate"):
        original = getattr(random.Random, name)
        monkeypatch.setattr(
            random.Random,
            name,
            lambda self, *a, _o=original, _n=name: copies.append(_n) or _o(self, *a),
        )
    same = WorkerState(context(1), get_rng_state())  # (captured before patching counts)
    copies.clear()
    for _ in range(10):
        with same.activate():
            pass
    assert copies == []
    # A worker with states of its own: installed by writing raw bytes back, both ways.
    for _ in range(3):
        with worker.activate():
            pass
    assert copies == []
    with worker.activate():
        random.random()  # drawn: its state is read back raw too
    with worker.activate():
        x = random.random(), float(np.random.rand())
    assert copies == []
    # ... and the numbers are the worker's own: a fresh seed-3 process drawing the same
    random.seed(3), np.random.seed(3)
    random.random(), np.random.rand(), random.random()
    assert x == (random.random(), float(np.random.rand()))


# --------------------------------------------------------------------------- a plugin's generator
class Library:
    """A library with one global generator, saved through the state hooks and switched by
    fingerprint through `twinkle_random_generators`; counts what the switch asks of it."""

    def __init__(self) -> None:
        self.generator = random.Random(0)
        self.gets = 0
        self.sets = 0

    @hookimpl
    def twinkle_seed(self, seed, full_determinism):
        self.generator.seed(seed)

    @hookimpl
    def twinkle_get_rng_state(self):
        return {"library": self.generator.getstate()}

    @hookimpl
    def twinkle_set_rng_state(self, state):
        if "library" in state:
            self.generator.setstate(state["library"])

    @hookimpl
    def twinkle_random_generators(self):
        return [LibraryGenerator(self)]


class LibraryGenerator(RandomGenerator):
    key = "library"

    def __init__(self, library: Library) -> None:
        self.library = library

    def read(self):
        return self.library.generator.getstate()

    def get(self):
        self.library.gets += 1
        return self.library.generator.getstate()

    def set(self, state):
        self.library.sets += 1
        self.library.generator.setstate(state)

    def fingerprint(self, state):
        return state


LIBRARY = Library()


@remote_class()
class Drawer:
    def __init__(self, first_draws):
        for _ in range(first_draws):  # each rank's constructor leaves a state of its own
            LIBRARY.generator.random()

    @remote_function(dispatch="all", collect="none")
    def draw(self, ranks):
        if get_worker_context().rank in ranks:
            return LIBRARY.generator.random()
        return None


@pytest.fixture
def library(fresh_plugins):
    global LIBRARY
    LIBRARY = Library()
    plugin_system().add(LIBRARY, name="library")
    yield LIBRARY
    shutdown()
    reset_plugins()


def test_a_plugin_generator_is_switched_by_fingerprint(library):
    assert any(isinstance(g, LibraryGenerator) for g in rng_switch().generators)
    initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2)], seed=7)
    drawer = Drawer(3, remote_group="g")
    expected = random.Random(7)
    for _ in range(3):
        expected.random()
    drawn = [drawer.draw([0, 1])() for _ in range(4)]
    # Both workers continue their own sequence from the seed (as processes of their own).
    assert drawn == [[expected.random()] * 2 for _ in range(4)]
    library.gets = library.sets = 0
    for _ in range(5):
        assert drawer.draw([])() == [None, None]  # nobody draws
    assert library.gets == 0  # nothing drawn: nothing fetched back
    library.sets = library.gets = 0
    assert drawer.draw([1])()[0] is None
    assert library.gets == 1  # only the worker that drew is fetched back


def test_a_plugin_without_a_switched_generator_still_gets_separate_streams(fresh_plugins):
    """A plugin giving only the state hooks: its workers' states are copied around each
    call (the switch does not know its key), and the numbers are the same."""

    class HooksOnly(Library):
        twinkle_random_generators = None  # type: ignore[assignment]

    global LIBRARY
    LIBRARY = HooksOnly()
    plugin_system().add(LIBRARY, name="hooks_only")
    try:
        initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2)], seed=7)
        assert not rng_switch().supported(get_rng_state())  # its key is nobody's
        drawer = Drawer(3, remote_group="g")
        expected = random.Random(7)
        for _ in range(3):
            expected.random()
        assert [drawer.draw([0, 1])() for _ in range(3)] == [
            [expected.random()] * 2 for _ in range(3)
        ]
    finally:
        shutdown()
        reset_plugins()
