"""Habits from seed-style scripts get a hint instead of a bare or silent error (issue 31,
item 4) and absurd sizes a clear error at once (issue 30, item 6)."""

from __future__ import annotations

import time

import pytest

from twinkle_core import ConfigurationError, DeviceGroup, DeviceMesh, LazyCollect

OPERATIONS = {
    "r + 1": lambda r: r + 1,
    "1 + r": lambda r: 1 + r,
    "r - 1": lambda r: r - 1,
    "r * 2": lambda r: r * 2,
    "2 * r": lambda r: 2 * r,
    "r / 2": lambda r: r / 2,
    "r // 2": lambda r: r // 2,
    "r % 2": lambda r: r % 2,
    "r ** 2": lambda r: r**2,
    "-r": lambda r: -r,
    "r < 1": lambda r: r < 1,
    "r >= 1": lambda r: r >= 1,
    "float(r)": lambda r: float(r),
    "int(r)": lambda r: int(r),
    "r[0]": lambda r: r[0],
}


@pytest.mark.parametrize("what", list(OPERATIONS))
def test_using_a_lazy_collect_as_its_value_says_to_call_it_first(what):
    calls = []
    r = LazyCollect(lambda timeout=None: calls.append(1) or 41, is_done=lambda: True)
    with pytest.raises(TypeError, match=r"call it first to get the value, e\.g\. r\(\) \+ 1"):
        OPERATIONS[what](r)
    assert calls == []  # nothing was collected behind the user's back
    assert r() + 1 == 42


def test_world_size_must_agree_with_the_mesh_sizes():
    assert DeviceMesh.from_sizes(world_size=4, dp_size=2, tp_size=2).world_size == 4
    assert DeviceMesh.from_sizes(world_size=4, dp_size=4).world_size == 4  # not 16
    with pytest.raises(ConfigurationError, match=r"world_size=8 but the sizes \(dp_size=4\)"):
        DeviceMesh.from_sizes(world_size=8, dp_size=4)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: DeviceGroup("g", 10**12), "asks for 1000000000000 ranks"),
        (lambda: DeviceGroup("g", 3 * 10**7), "asks for 30000000 ranks"),
        (lambda: DeviceGroup("g", [0, 10**12]), "ranks must be integers from 0 to 65535"),
        (lambda: DeviceMesh.from_sizes(dp_size=2**40, tp_size=2**40), "more than any cluster"),
    ],
)
def test_absurd_sizes_are_refused_at_once_without_building_anything(make, words):
    start = time.monotonic()
    with pytest.raises(ConfigurationError, match=words):
        make()
    assert time.monotonic() - start < 1.0  # nothing materialised (was a MemoryError)


def test_the_largest_allowed_group_still_builds():
    assert DeviceGroup("g", 1 << 16).num_workers == 1 << 16
