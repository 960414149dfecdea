"""The seeding hooks, called through a plugin: `twinkle_seed` seeds a plugin's library in every
worker, and `twinkle_get_rng_state`/`twinkle_set_rng_state` give each in-process worker its own
generator, as separate processes would have."""

from __future__ import annotations

import random

import pytest

from twinkle_core import (
    DeviceGroup,
    hookimpl,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugins import plugin_system, reset_plugins


class FakeLibrary:
    """A library with one global generator, seeded and saved only through twinkle's hooks."""

    def __init__(self) -> None:
        self.generator = random.Random(0)
        self.seeded: list[tuple[int, bool]] = []

    @hookimpl
    def twinkle_seed(self, seed, full_determinism):
        self.seeded.append((seed, full_determinism))
        self.generator.seed(seed)

    @hookimpl
    def twinkle_get_rng_state(self):
        return {"fake_library": self.generator.getstate()}

    @hookimpl
    def twinkle_set_rng_state(self, state):
        if "fake_library" in state:
            self.generator.setstate(state["fake_library"])


LIBRARY = FakeLibrary()


@remote_class()
class Drawer:
    def __init__(self):
        pass

    @remote_function(dispatch="all", collect="none")
    def draw(self):
        return LIBRARY.generator.random()


@pytest.fixture
def library(fresh_plugins):
    global LIBRARY
    LIBRARY = FakeLibrary()
    plugin_system().add(LIBRARY, name="fake_library")
    yield LIBRARY
    shutdown()
    reset_plugins()


def test_twinkle_seed_reaches_the_plugin_with_the_run_seed(library):
    initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2)], seed=7, full_determinism=True)
    assert (7, True) in library.seeded
    Drawer(remote_group="g")
    assert all(call == (7, True) for call in library.seeded)


def test_each_worker_keeps_its_own_plugin_generator(library):
    initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2)], seed=7)
    drawer = Drawer(remote_group="g")
    first, second = drawer.draw()(), drawer.draw()()
    expected = random.Random(7)
    # Both workers start from seed 7 and continue their own sequence: without the state hooks
    # worker 1 would continue where worker 0 left off.
    assert first == [expected.random()] * 2
    assert second == [expected.random()] * 2
